// The error envelope and body handling of the HTTP layer, exercised over real sockets through
// the real app factory and error handler, with test-local routes standing in for the
// submission routes (which use the same readBody).
import { expect } from 'chai';
import http from 'node:http';
import express from 'express';
import type { AddressInfo } from 'node:net';
import { createApp } from '../../src/http/app.ts';
import { readBody, readJsonDocument, MAX_SUBMISSION_BYTES } from '../../src/http/body.ts';
import { ServiceError, ERROR_CODES } from '../../src/core/errors.ts';
import { addLogSink } from '../../src/log.ts';
import { track } from '../support/resources.ts';

type Reply = { status: number; headers: http.IncomingHttpHeaders; body: string };

function request(url: string, opts: { method?: string; headers?: Record<string, string>; body?: Buffer | string } = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: opts.method ?? 'POST', headers: opts.headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}

/**
 * Streams `total` bytes of a JSON-ish body in `piece`-sized writes, honouring backpressure, and
 * resolves with the response as soon as it arrives (the server may answer before the body ends).
 */
function streamBody(url: string, total: number, piece: number): Promise<Reply & { sent: number }> {
  return new Promise((resolve, reject) => {
    let sent = 0;
    let answered = false;
    const chunk = Buffer.alloc(piece, 0x20); // whitespace: valid inside a JSON document
    const req = http.request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
      answered = true;
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        req.destroy();
        resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString('utf8'), sent });
      });
    });
    req.on('error', (err) => {
      if (!answered) reject(err);
    });
    const pump = () => {
      while (!answered && sent < total) {
        const n = Math.min(piece, total - sent);
        sent += n;
        if (!req.write(n === piece ? chunk : chunk.subarray(0, n))) {
          req.once('drain', pump);
          return;
        }
      }
      if (!answered) req.end();
    };
    pump();
  });
}

describe('HTTP errors and bodies', () => {
  let server: http.Server;
  let url: string;
  let release: () => void;
  const SECRET = 'sk-secret-in-exception-0123456789';

  before(async () => {
    const router = express.Router();
    router.post('/echo-size', async (req, res) => {
      const body = await readBody(req, MAX_SUBMISSION_BYTES);
      res.json({ bytes: body.length });
    });
    router.post('/document', async (req, res) => {
      res.json({ got: await readJsonDocument(req) });
    });
    router.get('/boom', () => {
      throw new Error(`database said: password=${SECRET}`);
    });
    router.get('/boom-async', async () => {
      await Promise.resolve();
      throw new TypeError(`cannot read ${SECRET}`);
    });
    router.get('/item/:id', (req, res) => {
      res.json({ id: req.params.id });
    });
    router.get('/refuse', () => {
      throw new ServiceError('conflict', 'Something changed.');
    });
    const app = createApp({ ready: async () => true, routers: [router] });
    server = http.createServer(app);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    release = track('server', url);
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    release();
  });

  it('accepts a body of exactly 2 MiB', async () => {
    const res = await streamBody(`${url}/echo-size`, MAX_SUBMISSION_BYTES, 16 * 1024);
    expect(res.status).to.equal(200);
    expect(JSON.parse(res.body)).to.deep.equal({ bytes: MAX_SUBMISSION_BYTES });
  });

  it('refuses 2 MiB + 1 byte sent in small pieces with 413 body_too_large', async () => {
    const res = await streamBody(`${url}/echo-size`, MAX_SUBMISSION_BYTES + 1, 1000);
    expect(res.status).to.equal(413);
    expect(JSON.parse(res.body).error.code).to.equal('body_too_large');
    expect(res.headers.connection).to.equal('close');
  });

  it('refuses a declared Content-Length over the limit before reading it', async () => {
    const res = await new Promise<Reply>((resolve, reject) => {
      const req = http.request(`${url}/echo-size`, {
        method: 'POST',
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': String(MAX_SUBMISSION_BYTES + 1) },
      }, (r) => {
        let body = '';
        r.on('data', (c) => (body += c));
        r.on('end', () => {
          req.destroy();
          resolve({ status: r.statusCode!, headers: r.headers, body });
        });
      });
      req.on('error', reject);
      req.write('{'); // never sends the rest: the answer must not wait for it
    });
    expect(res.status).to.equal(413);
    expect(JSON.parse(res.body).error.code).to.equal('body_too_large');
  });

  it('does not buffer more than the limit, however large the body', async () => {
    // What the server could have buffered is at most what it read off the socket.
    const serverSide = new Promise<number>((resolve) =>
      server.once('connection', (socket) => socket.once('close', () => resolve(socket.bytesRead))),
    );
    const res = await streamBody(`${url}/echo-size`, 256 * 1024 * 1024, 64 * 1024);
    expect(res.status).to.equal(413);
    // The server stops reading at the limit and closes: it read the limit plus what was in
    // flight, and far less than 256 MiB ever left the client.
    expect(await serverSide).to.be.lessThan(MAX_SUBMISSION_BYTES + 1024 * 1024);
    expect(res.sent).to.be.lessThan(64 * 1024 * 1024);
  });

  for (const type of [undefined, 'text/plain', 'application/x-www-form-urlencoded', 'application/jsonx']) {
    it(`refuses Content-Type ${type ?? '(none)'} with 415`, async () => {
      const headers: Record<string, string> = type ? { 'content-type': type } : {};
      const res = await request(`${url}/echo-size`, { headers, body: '{}' });
      expect(res.status).to.equal(415);
      expect(JSON.parse(res.body)).to.deep.equal({
        error: { code: 'unsupported_media_type', message: ERROR_CODES.unsupported_media_type.message },
      });
    });
  }

  it('accepts application/json with parameters', async () => {
    const res = await request(`${url}/document`, { headers: { 'content-type': 'Application/JSON; charset=utf-8' }, body: '{"a":1}' });
    expect(res.status).to.equal(200);
    expect(JSON.parse(res.body)).to.deep.equal({ got: { a: 1 } });
  });

  for (const [name, body] of [['malformed JSON', '{"a":'], ['invalid UTF-8', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x7d])], ['empty body', '']] as const) {
    it(`answers ${name} with 400 bad_request`, async () => {
      const res = await request(`${url}/document`, { headers: { 'content-type': 'application/json' }, body });
      expect(res.status).to.equal(400);
      expect(JSON.parse(res.body).error.code).to.equal('bad_request');
    });
  }

  it('answers a ServiceError with its own status and envelope', async () => {
    const res = await request(`${url}/refuse`, { method: 'GET' });
    expect(res.status).to.equal(409);
    expect(JSON.parse(res.body)).to.deep.equal({ error: { code: 'conflict', message: 'Something changed.' } });
  });

  for (const route of ['/boom', '/boom-async']) {
    it(`answers an unexpected fault (${route}) with 500 internal, saying nothing of the cause, logged under a reference`, async () => {
      const lines: string[] = [];
      const remove = addLogSink((l) => lines.push(l));
      try {
        const res = await request(`${url}${route}`, { method: 'GET' });
        expect(res.status).to.equal(500);
        const body = JSON.parse(res.body);
        expect(Object.keys(body)).to.deep.equal(['error']);
        expect(body.error.code).to.equal('internal');
        expect(res.body).to.not.include(SECRET);
        expect(res.body).to.not.match(/at .*\.ts:\d+/); // no stack
        const reference = /reference ([0-9a-f-]{36})/.exec(body.error.message)?.[1];
        expect(reference, body.error.message).to.be.a('string');
        expect(lines.some((l) => l.includes(reference!))).to.equal(true);
      } finally {
        remove();
      }
    });
  }

  it('answers a malformed path with 400, not 500', async () => {
    const ok = await request(`${url}/item/caf%C3%A9`, { method: 'GET' });
    expect(JSON.parse(ok.body)).to.deep.equal({ id: 'café' });
    const res = await request(`${url}/item/%E0%A4%A`, { method: 'GET' });
    expect(res.status).to.equal(400);
    expect(JSON.parse(res.body).error.code).to.equal('bad_request');
  });

  it('never logs a request body, on any path that reads one', async () => {
    const MARKER = 'prompt-marker-7f3a9c';
    const lines: string[] = [];
    const remove = addLogSink((l) => lines.push(l));
    try {
      const json = { 'content-type': 'application/json' };
      await request(`${url}/document`, { headers: json, body: `{"messages":"${MARKER}"}` });
      await request(`${url}/document`, { headers: json, body: `{"messages":"${MARKER}"` });
      await request(`${url}/document`, { headers: { 'content-type': 'text/plain' }, body: MARKER });
      await request(`${url}/echo-size`, { headers: json, body: `"${MARKER}${' '.repeat(MAX_SUBMISSION_BYTES)}"` });
      await request(`${url}/boom`, { method: 'GET', headers: { 'x-prompt': MARKER } });
    } finally {
      remove();
    }
    expect(lines.length).to.be.greaterThan(0); // the 500 was logged, so the sink did capture
    expect(lines.join('\n')).to.not.include(MARKER);
  });
});
