// Graceful stop for the HTTP listener: refuse new connections, close every connection that
// has no request in flight (keep-alive ones, and ones that never sent a request, which
// Node's own closeIdleConnections leaves open), let the rest finish, cut them at the grace.
import type http from 'node:http';
import type { Socket } from 'node:net';

export function trackConnections(server: http.Server): { drain(graceMs: number): Promise<void> } {
  const inFlight = new Map<Socket, number>();
  let draining = false;
  const closeIfIdle = (socket: Socket) => {
    if (draining && (inFlight.get(socket) ?? 0) === 0) socket.destroy();
  };
  server.on('connection', (socket: Socket) => {
    inFlight.set(socket, 0);
    socket.once('close', () => inFlight.delete(socket));
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
    async drain(graceMs) {
      draining = true;
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const socket of inFlight.keys()) closeIfIdle(socket);
      const timer = setTimeout(() => {
        for (const socket of inFlight.keys()) socket.destroy();
      }, graceMs);
      await closed;
      clearTimeout(timer);
    },
  };
}
