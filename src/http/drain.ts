// Graceful stop for the HTTP listener: refuse new connections, close every connection that
// has no request in flight (keep-alive ones, and ones that never sent a request, which
// Node's own closeIdleConnections leaves open), let the rest finish, cut them at the grace.
// It waits on the connections it saw, not on the listener: the listener counts only what its
// own socket accepted, not what the sockets sharing its port handed it (src/http/listen.ts).
import type http from 'node:http';
import type { Socket } from 'node:net';

export function trackConnections(server: http.Server): { open(): number; drain(graceMs: number): Promise<void> } {
  const inFlight = new Map<Socket, number>();
  let draining = false;
  const closeIfIdle = (socket: Socket) => {
    if (draining && (inFlight.get(socket) ?? 0) === 0) socket.destroy();
  };
  let emptied: (() => void) | null = null;
  server.on('connection', (socket: Socket) => {
    inFlight.set(socket, 0);
    socket.once('close', () => {
      inFlight.delete(socket);
      if (inFlight.size === 0) emptied?.();
    });
    closeIfIdle(socket);
  });
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const socket = req.socket;
    inFlight.set(socket, (inFlight.get(socket) ?? 0) + 1);
    if (draining) res.setHeader('connection', 'close');
    res.once('close', () => {
      if (!inFlight.has(socket)) return;
      inFlight.set(socket, Math.max(0, (inFlight.get(socket) ?? 1) - 1));
      closeIfIdle(socket);
    });
  });
  return {
    open: () => inFlight.size,
    async drain(graceMs) {
      draining = true;
      if (server.listening) server.close();
      const closed = new Promise<void>((resolve) => (inFlight.size === 0 ? resolve() : (emptied = resolve)));
      for (const socket of inFlight.keys()) closeIfIdle(socket);
      const timer = setTimeout(() => {
        for (const socket of inFlight.keys()) socket.destroy();
      }, graceMs);
      await closed;
      clearTimeout(timer);
    },
  };
}
