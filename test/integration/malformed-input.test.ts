// Input that must never become a 500: node's HTTP parser refusing control characters in header
// values (answered in the envelope, over raw sockets), and U+0000 wherever caller text could
// reach a PostgreSQL text column: every route and path parameter the router knows, and every
// string of every body a route takes.
import { expect } from 'chai';
import net from 'node:net';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { socketRequest, requestHead, rawRequest, json, routeTable, until, type RawResponse } from '../support/http.ts';
import { call } from '../support/control-plane.ts';

/** Writes `bytes` on a connection of its own, ends the client's side, and reads the answer until the server closes. */
function sendAndEnd(url: string, bytes: Buffer): Promise<RawResponse> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = net.connect(Number(port), hostname, () => socket.end(bytes));
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', reject);
    socket.on('close', () => {
      const raw = Buffer.concat(chunks);
      const split = raw.indexOf('\r\n\r\n');
      if (split < 0) return reject(new Error(`no answer: ${JSON.stringify(raw.toString('latin1'))}`));
      const [statusLine, ...lines] = raw.subarray(0, split).toString('latin1').split('\r\n');
      const headers: Record<string, string> = {};
      for (const line of lines) headers[line.slice(0, line.indexOf(':')).toLowerCase()] = line.slice(line.indexOf(':') + 1).trim();
      resolve({ status: Number(statusLine!.split(' ')[1]), headers, body: raw.subarray(split + 4) });
    });
  });
}

describe('malformed input', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const body = Buffer.from(JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'hi' }] }));
  const submission = (extra: [string, string | Buffer][]) => {
    const url = new URL(t.base);
    return requestHead('POST', `${url.pathname}/chat/completions`, [
      ['host', url.host],
      ['content-type', 'application/json'],
      ['content-length', String(body.length)],
      ['connection', 'close'],
      ['x-sarsen-key', t.key],
      ...extra,
    ]);
  };
  const envelope = (res: { status: number; headers: Record<string, unknown>; body: Buffer }) => {
    expect(res.status).to.equal(400);
    expect(res.headers['content-type']).to.equal('application/json');
    expect(Number(res.headers['content-length'])).to.equal(res.body.length);
    const parsed = JSON.parse(res.body.toString());
    expect(Object.keys(parsed)).to.deep.equal(['error']);
    expect(parsed.error.code).to.equal('bad_request');
    return parsed.error.message as string;
  };

  describe('control characters in header values', () => {
    for (const [label, byte] of [['0x01', 0x01], ['0x7F', 0x7f], ['NUL', 0x00], ['0x1B (escape)', 0x1b]] as const) {
      it(`a forwarded header holding ${label} is answered 400 bad_request in the envelope, naming the header; nothing reaches the provider`, async () => {
        const res = await socketRequest(t.base, submission([['anthropic-beta', Buffer.from([0x61, byte, 0x62])]]), body);
        const message = envelope(res);
        expect(message).to.include('`anthropic-beta`');
        expect(message).to.match(/control character/);
        expect(provider.journal).to.have.length(0);
      });
    }

    it('a tab still passes the parser and the header is dropped, not sent (a header carrying a control character)', async () => {
      const res = await socketRequest(t.base, submission([['anthropic-beta', 'a\tb'], ['anthropic-other', 'kept']]), body);
      expect(res.status, res.body.toString()).to.equal(200);
      expect(provider.journal[0]!.headers['anthropic-beta']).to.equal(undefined);
      expect(provider.journal[0]!.headers['anthropic-other']).to.equal('kept');
    });

    it('a control character in a header name is refused in the envelope too', async () => {
      const res = await socketRequest(t.base, submission([[`anthropic-\u0001beta`, 'x']]), body);
      expect(envelope(res)).to.match(/header name/);
    });

    it('is answered on a keep-alive connection between requests as well', async () => {
      const url = new URL(server.url);
      const socket = net.connect(Number(url.port), url.hostname);
      const received: Buffer[] = [];
      const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
      socket.on('data', (c: Buffer) => received.push(c));
      socket.write(`GET /healthz HTTP/1.1\r\nhost: ${url.host}\r\n\r\n`);
      const deadline = Date.now() + 10_000;
      while (!Buffer.concat(received).toString().includes('{"status":"ok"}')) {
        if (Date.now() > deadline) throw new Error('no answer to the first request');
        await new Promise((r) => setTimeout(r, 10));
      }
      socket.write(Buffer.concat([Buffer.from(`GET /healthz HTTP/1.1\r\nhost: ${url.host}\r\nopenai-beta: a`), Buffer.from([0x7f]), Buffer.from('\r\n\r\n')]));
      await closed;
      const text = Buffer.concat(received).toString('latin1');
      const second = text.slice(text.indexOf('HTTP/1.1', 1));
      expect(second).to.match(/^HTTP\/1\.1 400 /);
      expect(second).to.include('"code":"bad_request"');
      expect(second).to.include('`openai-beta`');
    });
  });

  it('the parser stays strict: a body framed two ways (Content-Length and Transfer-Encoding) is refused, in the envelope', async () => {
    const url = new URL(t.base);
    const head = requestHead('POST', `${url.pathname}/requests`, [
      ['host', url.host],
      ['content-type', 'application/json'],
      ['content-length', String(body.length)],
      ['transfer-encoding', 'chunked'],
      ['connection', 'close'],
      ['x-sarsen-key', t.key],
    ]);
    const chunked = Buffer.concat([Buffer.from(`${body.length.toString(16)}\r\n`), body, Buffer.from('\r\n0\r\n\r\n')]);
    envelope(await socketRequest(t.base, head, chunked));
    expect(provider.journal).to.have.length(0);
  });

  describe('a chunked body the parser refuses, after the route began reading it', () => {
    // Byte-level: the head is valid, the route takes the request, and the parser stops inside
    // the body. Each is answered in the envelope (the connection then closes), nothing reaches
    // the provider, and the server goes on serving.
    const cases: [string, Buffer, RegExp][] = [
      ['a chunk size that is not hexadecimal (zz)', Buffer.from('zz\r\n{}\r\n0\r\n\r\n'), /chunk size .*not a hexadecimal number/],
      ['a chunk size that overflows', Buffer.from('fffffffffffffffffff\r\n{}\r\n0\r\n\r\n'), /chunk size .*larger than this server accepts/],
      ['a chunk extension holding a control character', Buffer.from('2;\u0001x\r\n{}\r\n0\r\n\r\n'), /chunk extension/],
      ['chunk data longer than its size', Buffer.from('2\r\n{}XX\r\n0\r\n\r\n'), /not followed by CRLF/],
      ['chunk data cut short by the end of the connection', Buffer.from('20\r\n{"model":'), /ended before the request was complete/],
    ];
    for (const [label, chunked, message] of cases) {
      for (const route of ['/requests', '/chat/completions']) {
        it(`${label}, on POST ${route}: 400 bad_request in the envelope`, async () => {
          const url = new URL(t.base);
          const head = requestHead('POST', `${url.pathname}${route}`, [
            ['host', url.host],
            ['content-type', 'application/json'],
            ['transfer-encoding', 'chunked'],
            ['connection', 'close'],
            ['x-sarsen-key', t.key],
          ]);
          // The client sends all it has, then ends its side (a truncated body's only ending).
          const res = await sendAndEnd(t.base, Buffer.concat([head, chunked]));
          expect(envelope(res)).to.match(message);
          expect(provider.journal).to.have.length(0);
          expect((await rawRequest(`${server.url}/healthz`)).status).to.equal(200);
        });
      }
    }

    it('pipelined behind a request still being answered: that answer first, then the envelope', async () => {
      provider.enqueue({ kind: 'default', delayMs: 300 });
      const url = new URL(t.base);
      const own = Buffer.from(JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'pipelined' }] }));
      const first = requestHead('POST', `${url.pathname}/chat/completions`, [
        ['host', url.host],
        ['content-type', 'application/json'],
        ['content-length', String(own.length)],
        ['x-sarsen-key', t.key],
      ]);
      const second = requestHead('POST', `${url.pathname}/requests`, [
        ['host', url.host],
        ['content-type', 'application/json'],
        ['transfer-encoding', 'chunked'],
        ['x-sarsen-key', t.key],
      ]);
      // (The client keeps its side open: a sync route takes a half-closed connection for a caller gone.)
      const res = await socketRequest(t.base, Buffer.concat([first, own, second]), Buffer.from('zz\r\n'));
      expect(res.status, res.body.toString()).to.equal(200);
      const text = res.body.toString('latin1');
      const next = text.slice(text.indexOf('HTTP/1.1 '));
      expect(next).to.match(/^HTTP\/1\.1 400 /);
      expect(next).to.include('"code":"bad_request"');
      expect(provider.journal).to.have.length(1);
    });

    it('a route that answered before reading the body keeps its answer: no second one follows, the connection closes', async () => {
      const url = new URL(t.base);
      const head = requestHead('POST', `${url.pathname}/requests`, [
        ['host', url.host],
        ['content-type', 'application/json'],
        ['transfer-encoding', 'chunked'],
        ['x-sarsen-key', `sar_wrongkey_${'x'.repeat(40)}`],
      ]);
      const socket = net.connect(Number(url.port), url.hostname);
      const received: Buffer[] = [];
      const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
      socket.on('data', (c: Buffer) => received.push(c));
      socket.on('error', () => undefined);
      socket.write(head);
      await until(async () => (Buffer.concat(received).toString('latin1').includes('"code":"unauthorised"') ? true : undefined), 10_000, 10);
      socket.write('zz\r\n{}\r\n0\r\n\r\n');
      await closed;
      const text = Buffer.concat(received).toString('latin1');
      expect(text).to.match(/^HTTP\/1\.1 401 /);
      expect(text.match(/HTTP\/1\.1 /g)).to.have.length(1);
    });
  });

  describe('U+0000', () => {
    // A valid value for every path parameter the routes use. A route with a parameter missing
    // here fails the test, so whoever adds it says what a real value is.
    let params: Record<string, string>;
    let userId: string;
    before(async () => {
      const submitted = await rawRequest(`${t.base}/requests`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'a record to read' }] }),
      });
      const user = await call(server.url, 'POST', `/${t.tenancy}/v1/users`, { token: t.adminToken, body: { email: 'nul-test@example.com', role: 'viewer' } });
      userId = user.body.user_id;
      params = {
        tenancy: t.tenancy,
        namespace: t.namespace,
        ns: t.namespace,
        id: json(submitted).request_id,
        backend_id: t.backends.chat,
        rule_id: await t.addRule({ model: 'nul-test-*' }),
        api_key_id: t.apiKeyId,
        user_id: userId,
      };
    });

    const headers = (extra: Record<string, string> = {}) => ({
      authorization: `Bearer ${t.adminToken}`, // a console session for the administration routes
      'x-sarsen-key': t.key, // a key for the service routes (it wins over Authorization there)
      'content-type': 'application/json',
      ...extra,
    });
    const fill = (path: string, nulIn: string | null) =>
      path.replace(/:([A-Za-z_]+)/g, (_m, name: string) => {
        const value = params[name];
        if (value === undefined) throw new Error(`no valid value for path parameter :${name}; add one to the test's table`);
        return encodeURIComponent(value) + (name === nulIn ? '%00' : '');
      });
    const code = (res: RawResponse) => {
      expect(res.headers['content-type'], res.body.toString()).to.match(/^application\/json/);
      return json(res).error?.code as string | undefined;
    };

    it('in any path parameter of any route, as JSON or as SSE: 404 not_found, since no name or id can hold it', async () => {
      const routes = routeTable(server.app);
      expect(routes.length).to.be.greaterThan(30);
      let cases = 0;
      for (const { method, path } of routes) {
        for (const [, name] of path.matchAll(/:([A-Za-z_]+)/g)) {
          for (const accept of method === 'GET' ? ['application/json', 'text/event-stream'] : ['application/json']) {
            const res = await rawRequest(`${server.url}${fill(path, name!)}`, { method, headers: headers({ accept }), body: method === 'GET' || method === 'DELETE' ? undefined : '{}' });
            const where = `${method} ${path} with U+0000 in :${name} (${accept})`;
            expect(res.status, `${where}: ${res.body}`).to.equal(404);
            expect(code(res), where).to.equal('not_found');
            cases++;
          }
        }
      }
      expect(cases).to.be.greaterThan(50);
      // Nothing was touched on the way: the resources named next to the NUL are all still there.
      for (const [path, expected] of [[`/namespaces/${t.namespace}/backends/${t.backends.chat}`, 200], [`/namespaces/${t.namespace}/routing-rules/${params.rule_id}`, 200]] as const) {
        expect((await call(server.url, 'GET', `/${t.tenancy}/v1${path}`, { token: t.adminToken })).status).to.equal(expected);
      }
    });

    it('in the query parameters routes read (limit, after, since, dialect) on every route: never a 500', async () => {
      for (const { method, path } of routeTable(server.app)) {
        if (method === 'DELETE') continue;
        const res = await rawRequest(`${server.url}${fill(path, null)}?limit=%00&after=%00&since=%00&dialect=%00`, {
          method,
          headers: headers(),
          body: method === 'GET' ? undefined : '{}',
        });
        expect(res.status, `${method} ${path}: ${res.body}`).to.be.below(500);
      }
    });

    it('on the vendors\' own routes, in the ids their listings page by: 400 in the vendor\'s error shape, whatever refused it', async () => {
      // The listings hand `after` (and the message batches' `after_id`, `before_id`, the files'
      // `purpose`) to PostgreSQL, which refuses the NUL itself: the vendor's shape all the same.
      const cases: [string, (body: any) => void][] = [];
      const openai = (body: any) => expect(body.error).to.have.keys(['message', 'type', 'param', 'code']);
      const anthropic = (body: any) => expect(body).to.include({ type: 'error' }).and.to.have.nested.property('error.type', 'invalid_request_error');
      for (const q of ['after=%00', 'purpose=%00']) cases.push([`files?${q}`, openai]);
      cases.push(['batches?after=%00', openai]);
      for (const q of ['after_id=%00', 'before_id=%00']) cases.push([`messages/batches?${q}`, anthropic]);
      for (const [path, shape] of cases) {
        const res = await rawRequest(`${server.url}/${t.tenancy}/${t.namespace}/v1/${path}`, { method: 'GET', headers: headers() });
        expect(res.status, `${path}: ${res.body}`).to.equal(400);
        expect(res.headers['content-type'], path).to.match(/^application\/json/);
        shape(json(res));
      }
    });

    // A valid body for every route that takes one, and how a NUL in each of its strings is
    // answered (400 unless said otherwise). `free` strings are content the body carries to the
    // provider, where U+0000 is allowed. A body route missing here fails the test.
    const bodies: Record<string, { body: object; status?: number; code?: string; free?: string[] }> = {
      'POST /:tenancy/v1/sessions': { body: { email: 'someone@example.com', password: 'a password of some length' }, status: 401, code: 'unauthorised' },
      'POST /:tenancy/v1/sessions/cookie': { body: { email: 'someone@example.com', password: 'a password of some length' }, status: 401, code: 'unauthorised' },
      'POST /:tenancy/v1/account/password': { body: { current_password: 'not the current password', new_password: 'a new password of mine' }, status: 403, code: 'password_rejected' },
      'PATCH /:tenancy/v1/tenancy': { body: { display_name: 'Acme' } },
      'POST /:tenancy/v1/namespaces': { body: { name: 'fresh' } },
      'PATCH /:tenancy/v1/namespaces/:ns': { body: { retention_minutes: 10 } },
      'POST /:tenancy/v1/namespaces/:ns/backends': { body: { name: 'b2', kind: 'chat_compat', address: 'http://127.0.0.1:9/v1', credential: 'sk-x' } },
      'PATCH /:tenancy/v1/namespaces/:ns/backends/:backend_id': { body: { name: 'renamed', address: 'http://127.0.0.1:9/v1' } },
      'POST /:tenancy/v1/namespaces/:ns/routing-rules': { body: { model: 'm-*', backend_id: 'bk_none', rewrite_model: 'm' } },
      'PATCH /:tenancy/v1/namespaces/:ns/routing-rules/:rule_id': { body: { model: 'm2-*', backend_id: 'bk_none' } },
      'POST /:tenancy/v1/namespaces/:ns/api-keys': { body: { name: 'k2', grants: ['use'] } },
      // Numbers only: no string to carry a NUL, listed so that every body route is accounted for.
      'PATCH /:tenancy/v1/namespaces/:ns/api-keys/:api_key_id': { body: { limits: { requests_per_minute: 10 } } },
      'POST /:tenancy/v1/users': { body: { email: 'new@example.com', role: 'viewer' } },
      'PATCH /:tenancy/v1/users/:user_id': { body: { role: 'viewer' } },
      'POST /:tenancy/:namespace/v1/chat/completions': { body: { model: 'gpt-test', messages: [{ role: 'user', content: 'hi' }] }, free: ['messages.0.role', 'messages.0.content'] },
      'POST /:tenancy/:namespace/v1/messages': { body: { model: 'claude-test', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }, free: ['messages.0.role', 'messages.0.content'] },
      'POST /:tenancy/:namespace/v1/responses': { body: { model: 'gpt-test', input: [{ role: 'user', content: 'hi' }] }, free: ['input.0.role', 'input.0.content'] },
      'POST /:tenancy/:namespace/v1/requests': { body: { model: 'gpt-test', messages: [{ role: 'user', content: 'hi' }] }, free: ['messages.0.role', 'messages.0.content'] },
      // The vendors' batch routes (a message batch's params are carried to the provider as its lines).
      'POST /:tenancy/:namespace/v1/batches': { body: { input_file_id: 'file_none', endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { team: 'a' } } },
      'POST /:tenancy/:namespace/v1/messages/batches': {
        body: { requests: [{ custom_id: 'one', params: { model: 'claude-test', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] } }] },
        free: ['requests.0.params.model', 'requests.0.params.messages.0.role', 'requests.0.params.messages.0.content'],
      },
    };
    // POST routes that read no body at all, and POST /files, whose multipart body has its own case.
    const bodiless = new Set([
      'POST /:tenancy/:namespace/v1/requests/:id/cancel',
      'POST /:tenancy/v1/namespaces/:ns/requests/:id/cancel',
      'POST /:tenancy/:namespace/v1/responses/:id/cancel',
      'POST /:tenancy/:namespace/v1/batches/:id/cancel',
      'POST /:tenancy/:namespace/v1/messages/batches/:id/cancel',
      'POST /:tenancy/:namespace/v1/files',
    ]);

    /** Every string in `value` (values and keys), by dotted path, with a copy holding U+0000 there. */
    function* withNul(value: unknown, path: string[] = []): Generator<[string, unknown]> {
      if (typeof value === 'string') yield [path.join('.'), `${value}\u0000`];
      else if (Array.isArray(value)) {
        for (const [i, v] of value.entries()) for (const [p, nv] of withNul(v, [...path, String(i)])) yield [p, value.map((x, j) => (j === i ? nv : x))];
      } else if (value !== null && typeof value === 'object') {
        for (const [k, v] of Object.entries(value)) for (const [p, nv] of withNul(v, [...path, k])) yield [p, { ...value, [k]: nv }];
      }
    }

    it('in any string of any body a route takes: 400 bad_request (sign-in: the one 401), or carried to the provider', async () => {
      let cases = 0;
      for (const { method, path } of routeTable(server.app)) {
        if (method !== 'POST' && method !== 'PATCH' && method !== 'PUT') continue;
        const route = `${method} ${path}`;
        if (bodiless.has(route)) continue;
        const entry = bodies[route];
        if (!entry) throw new Error(`${route} takes a body: add a valid one to the test's table`);
        for (const [field, body] of withNul(entry.body)) {
          const res = await rawRequest(`${server.url}${fill(path, null)}`, { method, headers: headers(), body: JSON.stringify(body) });
          const where = `${route} with U+0000 in ${field}: ${res.body}`;
          if (entry.free?.includes(field)) {
            expect(res.status, where).to.be.oneOf([200, 202]);
          } else {
            expect(res.status, where).to.equal(entry.status ?? 400);
            expect(code(res), where).to.equal(entry.code ?? 'bad_request');
          }
          cases++;
        }
      }
      expect(cases).to.be.greaterThan(25);
    });

    it('in the fields of a file upload (multipart): a NUL purpose is 400, a NUL in the file name is dropped from the stored name', async () => {
      const upload = (purpose: string, filename: string) => {
        const boundary = 'nul-test-boundary';
        const body = Buffer.from(
          `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n${purpose}\r\n` +
            `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${filename}"\r\nContent-Type: application/jsonl\r\n\r\n` +
            `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-test","messages":[]}}\n\r\n--${boundary}--\r\n`,
        );
        return rawRequest(`${t.base}/files`, { method: 'POST', headers: headers({ 'content-type': `multipart/form-data; boundary=${boundary}` }), body });
      };
      const refused = await upload('batch\u0000', 'lines.jsonl');
      expect(refused.status, refused.body.toString()).to.equal(400);
      expect(code(refused)).to.equal('bad_request');
      const kept = await upload('batch', 'li\u0000nes.jsonl');
      expect(kept.status, kept.body.toString()).to.equal(200);
      expect(json(kept).filename).to.equal('lines.jsonl');
    });

    it('a sign-in with U+0000 in the email answers exactly as every other rejected sign-in', async () => {
      const signIn = (email: string, password: string) =>
        rawRequest(`${server.url}/${t.tenancy}/v1/sessions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ email, password }) });
      const wrong = await signIn('nobody@example.com', 'a wrong password here');
      const nul = await signIn('nul-test@example.com\u0000', 'a wrong password here');
      expect(wrong.status).to.equal(401);
      expect(nul.status).to.equal(401);
      expect(nul.body.toString()).to.equal(wrong.body.toString());
      expect(nul.headers['content-type']).to.equal(wrong.headers['content-type']);
    });

    it('a NUL in message content is stored and sent upstream with its escape exactly as sent; a NUL model is 400', async () => {
      const sent = '{"messages":[{"content":"before\\u0000after","role":"user"}],"model":"gpt-test"}'; // canonical already
      const res = await rawRequest(`${t.base}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key }, body: sent });
      expect(res.status, res.body.toString()).to.equal(200);
      expect(provider.journal.at(-1)!.body.toString()).to.equal(sent);
      const stored = await until(async () => {
        const { rows } = await server.pool.query(
          `SELECT b.body FROM sarsen.request_bodies b JOIN sarsen.requests q ON q.id = b.request_id
            WHERE q.namespace_id = $1 ORDER BY q.id DESC LIMIT 1`,
          [t.namespaceId],
        );
        return rows[0]?.body as string | undefined;
      });
      expect(stored).to.equal(sent);
      const model = await rawRequest(`${t.base}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: '{"model":"gpt-\\u0000","messages":[]}',
      });
      expect(model.status).to.equal(400);
      expect(json(model).error.message).to.match(/model/);
    });
  });
});
