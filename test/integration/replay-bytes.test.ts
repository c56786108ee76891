// Stored frames and slices of a large answer are read back as text whose characters are their
// bytes, or as base64 when they hold a NUL (src/db/columns.ts, "Bytes"). Either way a replay and
// a stored answer are the provider's bytes: every byte value, bytes that are not UTF-8, a resume
// in the middle of a stored row, a row with a NUL beside rows without.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { replayStream, withIds, query } from './streaming-support.ts';
import { settled } from '../support/chaos.ts';

/** Every byte value but the line breaks (which end an SSE line), with `\0` only when asked, then a UTF-8 fragment cut short. */
function everyByte(withNul: boolean): Buffer {
  const values = Array.from({ length: 256 }, (_, b) => b).filter((b) => b !== 0x0a && b !== 0x0d && (withNul || b !== 0));
  return Buffer.concat([Buffer.from(values), Buffer.from([0xe2, 0x82])]);
}

/** An SSE frame whose data is `body`, repeated to about `size` bytes. */
const frame = (body: Buffer, size: number): Buffer =>
  Buffer.concat([Buffer.from('data: '), ...Array.from({ length: Math.ceil(size / body.length) }, () => body), Buffer.from('\n\n')]);

describe('stored bytes read back exactly', function () {
  this.timeout(120_000);
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

  it('a replay of frames of every byte value, whole and resumed from every frame', async () => {
    // 60 frames of about 3 KB: several stored rows; the 31st holds a NUL, so its row is read as base64.
    const frames = Array.from({ length: 60 }, (_, i) => frame(everyByte(i === 30), 3000));
    provider.enqueue({ kind: 'sse', frames });
    const accepted = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: 'every byte' }] }),
    });
    const id = json(accepted).request_id as string;
    await settled(server.pool, [id], 60_000);
    const rows = await query<{ n: number; packed: number }>(server.db, `SELECT count(*)::int AS n, count(frame_lengths)::int AS packed FROM sarsen.chunks WHERE request_id = $1`, [id]);
    expect(rows[0]!.n, 'stored rows').to.be.greaterThan(1);
    expect(rows[0]!.packed, 'rows of several frames').to.be.greaterThan(0);

    const whole = await replayStream(t, id).done;
    expect(whole.complete).to.equal(true);
    expect(whole.body.equals(withIds(frames))).to.equal(true);
    for (let after = 1; after < frames.length; after++) {
      const resumed = await replayStream(t, id, after).done;
      expect(resumed.body.equals(withIds(frames.slice(after), after + 1)), `resumed after ${after}`).to.equal(true);
    }
  });

  for (const withNul of [false, true]) {
    it(`a stored answer of ${withNul ? 'bytes with a NUL (read as base64)' : 'every other byte value (read as text)'}, over 256 KiB, read in slices`, async () => {
      const body = Buffer.concat([Buffer.from('{"x":"'), ...Array.from({ length: 1200 }, () => everyByte(withNul)), Buffer.from('"}')]);
      provider.enqueue({ kind: 'json', body });
      const request = JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: `answer bytes ${withNul}` }] });
      const send = () => rawRequest(`${t.base}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key }, body: request });
      const first = await send();
      expect(first.body.equals(body)).to.equal(true);
      // The identical body attaches to the settled request: its answer is read from the table.
      const again = await send();
      expect(again.status).to.equal(200);
      expect(again.body.equals(body)).to.equal(true);
      expect(provider.journal.filter((e) => e.json?.messages?.[0]?.content === `answer bytes ${withNul}`)).to.have.length(1);
    });
  }
});
