import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';

describe('HTTP skeleton', () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  it('answers /healthz and /readyz', async () => {
    const health = await fetch(`${server.url}/healthz`);
    expect(health.status).to.equal(200);
    const ready = await fetch(`${server.url}/readyz`);
    expect(ready.status).to.equal(200);
    expect(await ready.json()).to.deep.equal({ status: 'ready' });
  });

  it('answers unknown routes 404 in the envelope', async () => {
    const res = await fetch(`${server.url}/nope/nothing`);
    expect(res.status).to.equal(404);
    expect(res.headers.get('content-type')).to.match(/^application\/json/);
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(body.error.code).to.equal('not_found');
    expect(body.error.message).to.be.a('string');
  });
});

describe('startup logging', () => {
  it('never logs the content of a key secret while starting and stopping', async () => {
    const { addLogSink } = await import('../../src/log.ts');
    const lines: string[] = [];
    const remove = addLogSink((l) => lines.push(l));
    let server: TestServer | undefined;
    try {
      server = await startTestServer();
      await fetch(`${server.url}/readyz`);
    } finally {
      await server?.close();
      remove();
    }
    const text = lines.join('\n');
    expect(text).to.include('sarsen listening');
    for (const secret of [server!.secrets.credentialKey, server!.secrets.apiKeyHashKey]) {
      for (const encoding of ['hex', 'base64', 'base64url', 'latin1'] as const) expect(text).to.not.include(secret.toString(encoding));
    }
  });
});
