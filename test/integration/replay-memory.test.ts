// Memory per reader (issue 14, issue 29): a replay reads stored frames a page at a time and reads
// the next page only once the caller's socket took the last, so fifty callers that never read a
// 12 MB stored stream cost the process a page each, not the stream each, and the memory goes
// when they disconnect. Measured on a real `sarsen` process's resident set: first as a user sees
// it (RSS, nothing collected by the test), then after forced collections (what the readers hold).
import fs from 'node:fs';
import net from 'node:net';
import { expect } from 'chai';
import { inspect, type Inspector } from '../support/inspector.ts';
import { startFakeProvider, chatFrames, chatCompletionBody, responsesFrames, type FakeProvider } from '../support/fake-provider.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { settled } from '../support/chaos.ts';

const READERS = 50;
const STREAM_BYTES = 12 * 1024 * 1024;
// As `npm start` runs it (package.json): the allocator settings matter to what RSS shows.
const RUNTIME = { MALLOC_ARENA_MAX: '2', NODE_OPTIONS: '--max-semi-space-size=16 --max-old-space-size=1024' };
const INSPECTED = { ...RUNTIME, NODE_OPTIONS: `${RUNTIME.NODE_OPTIONS} --inspect=127.0.0.1:0` };
// The targets (docs/durability.md "Bounded memory"): what readers take (the median visit's peak
// over the resting size it started from; every visit's within a tighter bound than before) and how
// close to that a process is 30 s after they left (every visit). A visit's peak is mostly V8
// growing back its young generation (32 MB) and garbage not yet collected, and moves by some 20 MB
// from one visit to the next. A regression that kept pages in pg's results through young
// collections gave +71 to +89 MB a visit (+26 to +60 MB without it): the median catches it, and
// so does the bound on single visits, 96 MB before, which held it.
const MAX_PEAK_MB = 64;
const MAX_ANY_PEAK_MB = 72;
const MAX_LEFT_BEHIND_MB = 16;
const VISITS = 3;
const AFTER_LEAVING_MS = 30_000;

function rssMb(pid: number): number {
  const kb = Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]);
  return kb / 1024;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `count` connections that each send `request` and never read the answer. */
function silentCallers(port: number, count: number, request: string): Promise<net.Socket[]> {
  return Promise.all(
    Array.from({ length: count }, () =>
      new Promise<net.Socket>((resolve, reject) => {
        const s = net.connect(port, '127.0.0.1', () => {
          s.pause(); // never read: the kernel's buffers fill, then the server's
          s.write(request);
          resolve(s);
        });
        s.on('error', reject);
      }),
    ),
  );
}

/** RSS once the process is at rest: sampled every second until it moved less than 2 MB over 10 s (at most 90 s). */
async function restingRssMb(pid: number): Promise<number> {
  const samples: number[] = [];
  for (let i = 0; i < 90; i++) {
    samples.push(rssMb(pid));
    const last = samples.slice(-10);
    if (last.length === 10 && Math.max(...last) - Math.min(...last) < 2) break;
    await sleep(1000);
  }
  return samples.at(-1)!;
}

type Visit = { start: number; peak: number; after: { s: number; mb: number }[] };

/**
 * Readers come (`arrive` answers their sockets), stay `stayMs` while RSS is sampled every 100 ms,
 * and leave; RSS is then sampled for 30 s. Nothing is collected by the test.
 */
async function visit(pid: number, arrive: () => Promise<net.Socket[]>, stayMs: number): Promise<Visit> {
  const start = await restingRssMb(pid);
  const sockets = await arrive();
  let peak = start;
  for (let waited = 0; waited < stayMs; waited += 100) {
    await sleep(100);
    peak = Math.max(peak, rssMb(pid));
  }
  for (const s of sockets) s.destroy();
  const after: { s: number; mb: number }[] = [];
  for (let s = 1; s <= AFTER_LEAVING_MS / 1000; s++) {
    await sleep(1000);
    const mb = rssMb(pid);
    peak = Math.max(peak, mb);
    if (s === 3 || s % 5 === 0) after.push({ s, mb });
  }
  return { start, peak, after };
}

const signed = (n: number) => `${n >= 0 ? '+' : ''}${n.toFixed(1)}`;
const describeVisit = (v: Visit) =>
  `RSS at rest ${v.start.toFixed(0)} MB, peak ${signed(v.peak - v.start)} MB, after they left ${v.after.map((a) => `${a.s} s ${signed(a.mb - v.start)}`).join(', ')} MB`;

function expectWithinTargets(visits: Visit[]): void {
  const peaks = visits.map((v) => v.peak - v.start);
  const median = [...peaks].sort((a, b) => a - b)[Math.floor(peaks.length / 2)]!;
  expect(median, `median peak RSS growth of ${visits.length} visits (${visits.map(describeVisit).join('; ')}), MB`).to.be.at.most(MAX_PEAK_MB);
  for (const [i, v] of visits.entries()) {
    expect(peaks[i], `visit ${i + 1} (${describeVisit(v)}): peak RSS growth, MB`).to.be.at.most(MAX_ANY_PEAK_MB);
    expect(v.after.at(-1)!.mb - v.start, `visit ${i + 1} (${describeVisit(v)}): RSS above the start ${AFTER_LEAVING_MS / 1000} s after they left, MB`).to.be.at.most(MAX_LEFT_BEHIND_MB);
  }
}

/** Readers that send `request` and never read the answer visit `sarsen`, VISITS times after a first: each within the targets. */
async function visitsWithinTargets(sarsen: SarsenProcess, request: string): Promise<void> {
  const arrive = () => silentCallers(Number(new URL(sarsen.url).port), READERS, request);
  // A first visit, not counted: the counted ones start from where a process rests once readers
  // came and went. Right after the whole replay the idle collection can leave it some 20-30 MB
  // below that, and a visit counted from there measured the process coming back to its rest
  // (+87 MB, +23 MB still there 30 s later, then +55 and +1 for the next two visits).
  const first = await visit(sarsen.child.pid!, arrive, 5_000);
  const visits: Visit[] = [];
  for (let i = 0; i < VISITS; i++) visits.push(await visit(sarsen.child.pid!, arrive, 5_000));
  process.stderr.write(
    [`(first visit, not counted: ${describeVisit(first)})`, ...visits.map((v, i) => `(visit ${i + 1} of ${READERS} readers: ${describeVisit(v)})`)].map((l) => `      ${l}\n`).join(''),
  );
  expectWithinTargets(visits);
}

/** Stores a stream of about 12 MB through `sarsen`; answers its replay path and its byte count. */
async function storeLongStream(d: Deployment, sarsen: SarsenProcess, t: Tenant, provider: FakeProvider): Promise<{ path: string; total: number }> {
  const piece = 'x'.repeat(4000);
  const frames = chatFrames(Array.from({ length: Math.ceil(STREAM_BYTES / 4100) }, () => piece));
  const total = frames.reduce((n, f) => n + Buffer.byteLength(f), 0);
  provider.rule(() => ({ kind: 'sse', frames }));
  const accepted = await rawRequest(`${t.base}/requests`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
    body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: 'long' }] }),
  });
  expect(accepted.status).to.equal(202);
  const id = json(accepted).request_id as string;
  await settled(d.pool, [id], 60_000);
  const path = `/${t.tenancy}/${t.namespace}/v1/requests/${id}`;
  // One whole replay first, so that what the process keeps anyway is in the baseline.
  const whole = await rawRequest(`${sarsen.url}${path}`, { headers: { 'x-sarsen-key': t.key, accept: 'text/event-stream' } });
  expect(whole.body.toString('utf8').replace(/^id: \d+\n/gm, '')).to.have.length(total);
  return { path, total };
}

/**
 * Stores a background response's stream through `sarsen`: 12 MB of deltas, then a final event
 * whose Response holds 12 MB of text (a real one holds the whole output). Answers the path that
 * resumes it after its first four events (GET /responses/{id}?stream=true&starting_after=3).
 */
async function storeLongResponse(sarsen: SarsenProcess, t: Tenant, provider: FakeProvider): Promise<string> {
  // The vendor's frames, numbered in order; the other closing events carry a short text.
  const [opened, inProgress, added, partAdded, delta, ...closing] = responsesFrames(['x'.repeat(4000)], { id: 'resp_long_stream' });
  const deltas = Array.from({ length: Math.ceil(STREAM_BYTES / 4100) }, () => delta!);
  let seq = 0;
  const completed = closing.pop()!.replaceAll('x'.repeat(4000), 'x'.repeat(STREAM_BYTES));
  const frames = [opened!, inProgress!, added!, partAdded!, ...deltas, ...closing.map((f) => f.replaceAll('x'.repeat(4000), 'x')), completed]
    .map((f) => f.replace(/"sequence_number":\d+/, () => `"sequence_number":${seq++}`));
  provider.reset(); // the rules of a stream stored before do not answer this one
  provider.rule(() => ({ kind: 'sse', frames }));
  // Read whole as it is produced: its end is the request's.
  const created = await rawRequest(`${t.base}/responses`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
    body: JSON.stringify({ model: 'gpt-test', input: 'long', background: true, stream: true }),
  });
  expect(created.status).to.equal(200);
  const path = `/${t.tenancy}/${t.namespace}/v1/responses/resp_long_stream?stream=true&starting_after=3`;
  const whole = await rawRequest(`${sarsen.url}${path}`, { headers: { 'x-sarsen-key': t.key } });
  expect(whole.body.toString('latin1')).to.equal(frames.slice(4).join(''));
  return path;
}

describe('resident memory of readers, as a user sees it (nothing collected by the test)', function () {
  this.timeout(600_000);
  let provider: FakeProvider;
  let d: Deployment;
  let sarsen: SarsenProcess;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment();
    sarsen = await d.start('both', RUNTIME);
    t = await provision(d.asServer(sarsen), provider);
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it(`${READERS} readers that never read a 12 MB stored stream, ${VISITS} times: peak RSS growth at most ${MAX_PEAK_MB} MB (median; each at most ${MAX_ANY_PEAK_MB}), within ${MAX_LEFT_BEHIND_MB} MB of the start ${AFTER_LEAVING_MS / 1000} s after they left`, async () => {
    const { path } = await storeLongStream(d, sarsen, t, provider);
    await visitsWithinTargets(sarsen, `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-sarsen-key: ${t.key}\r\naccept: text/event-stream\r\n\r\n`);
  });

  // The resume reads pages through the one stream writer, which lets a page go once the socket
  // took it, as replay's above, and a stream read again does not read its final Response. Each
  // reader reading that 12 MB event grew the process by +540 to +609 MB a visit; written a frame
  // at a time by a writer of its own (a wait for the buffer to drain, but the page kept through
  // it), +65 to +81 MB (median +81); now +34 to +41 MB.
  it(`${READERS} readers that never read a 12 MB stored background stream, ${VISITS} times: within the same targets`, async () => {
    const path = await storeLongResponse(sarsen, t, provider);
    await visitsWithinTargets(sarsen, `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-sarsen-key: ${t.key}\r\n\r\n`);
  });
});

const WAVES = 4;

describe('replay memory per reader', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let d: Deployment;
  let sarsen: SarsenProcess;
  let t: Tenant;
  let inspector: Inspector;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment();
    sarsen = await d.start('both', INSPECTED);
    inspector = await inspect(sarsen);
    t = await provision(d.asServer(sarsen), provider);
  });
  after(async () => {
    inspector?.close();
    await d?.close();
    await provider?.close();
  });

  it(`holds about a page per reader: ${READERS} readers that never read a 12 MB stored stream`, async () => {
    const { path, total } = await storeLongStream(d, sarsen, t, provider);
    await sleep(1000);

    const { port } = new URL(sarsen.url);
    /**
     * Connects the readers and lets them sit there for 5 s, sampling RSS (the peak); then, still
     * connected, collects garbage and reads RSS again (what the readers hold); then disconnects.
     */
    const wave = async (): Promise<{ peak: number; held: number; objects: number }> => {
      const sockets = await silentCallers(Number(port), READERS, `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-sarsen-key: ${t.key}\r\naccept: text/event-stream\r\n\r\n`);
      let peak = 0;
      for (let i = 0; i < 20; i++) {
        await sleep(250);
        peak = Math.max(peak, rssMb(sarsen.child.pid!));
      }
      const { heap, external } = await inspector.collectedHeapMb();
      const held = rssMb(sarsen.child.pid!);
      for (const s of sockets) s.destroy();
      await sleep(2000);
      return { peak, held, objects: heap + external };
    };
    // Wave after wave, collected by the test: what the readers hold is the heap and Buffers after
    // a collection with them still connected (about 0.15 MB a reader, measured: +7 to +8 MB a
    // wave; a stream each would be 600 MB), and nothing of a wave stays once it left. RSS after
    // that collection is bounded too, more loosely. The peaks here count from a collected
    // baseline and are only reported: the suite above bounds them as a user sees them.
    await inspector.collectedHeapMb();
    const heapBefore = await inspector.collectedHeapMb();
    const before = rssMb(sarsen.child.pid!);
    const waves: { peak: number; held: number; objects: number }[] = [];
    const after: { heap: number; external: number }[] = [];
    for (let i = 0; i < WAVES; i++) {
      waves.push(await wave());
      after.push(await inspector.collectedHeapMb());
    }
    const mb = (n: number) => `${n >= 0 ? '+' : ''}${n.toFixed(1)}`;
    process.stderr.write(`      (stream ${(total / 1048576).toFixed(1)} MB; collected RSS before ${before.toFixed(0)} MB; ${WAVES} waves of ${READERS} readers: collected RSS with them connected ${waves.map((w) => mb(w.held - before)).join(', ')} MB (heap and Buffers ${waves.map((w) => mb(w.objects - heapBefore.heap - heapBefore.external)).join(', ')} MB), uncollected peaks ${waves.map((w) => mb(w.peak - before)).join(', ')} MB; heap after each wave left, collected: ${after.map((a) => mb(a.heap - heapBefore.heap)).join(', ')} MB, external ${after.map((a) => mb(a.external - heapBefore.external)).join(', ')} MB)\n`);
    for (const [i, a] of after.entries()) expect(a.heap + a.external - heapBefore.heap - heapBefore.external, `heap still held after wave ${i + 1} left, MB`).to.be.at.most(4);
    for (const [i, w] of waves.entries()) {
      expect(w.objects - heapBefore.heap - heapBefore.external, `heap and Buffers held with wave ${i + 1}'s readers connected, MB`).to.be.at.most(24);
      expect(w.held - before, `RSS growth with wave ${i + 1}'s readers connected, MB`).to.be.at.most(128);
    }
  });
});

describe('held answers of a large stored body', function () {
  this.timeout(180_000);
  const WAITERS = 30;
  let provider: FakeProvider;
  let d: Deployment;
  let api: SarsenProcess;
  let t: Tenant;
  let inspector: Inspector;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment();
    // The API process reads the answer back from the database (another process produced it).
    api = await d.start('api', INSPECTED);
    inspector = await inspect(api);
    await d.start('executor');
    t = await provision(d.asServer(api), provider);
  });
  after(async () => {
    inspector?.close();
    await d?.close();
    await provider?.close();
  });

  it(`holds a slice per waiter: ${WAITERS} callers held on one 10 MB answer that never read it`, async () => {
    const body = JSON.stringify(chatCompletionBody('y'.repeat(10 * 1024 * 1024)));
    provider.rule(() => ({ kind: 'json', body, delayMs: 1500 }));
    const request = JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'large' }] });
    const objectsBefore = await inspector.collectedHeapMb();
    const before = rssMb(api.child.pid!);
    const { port } = new URL(api.url);
    // Identical bodies: every caller attaches to the one execution and is held on it.
    const sockets = await silentCallers(
      Number(port),
      WAITERS,
      `POST /${t.tenancy}/${t.namespace}/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nx-sarsen-key: ${t.key}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(request)}\r\n\r\n${request}`,
    );
    let peak = before;
    for (let i = 0; i < 32; i++) {
      await sleep(250);
      peak = Math.max(peak, rssMb(api.child.pid!));
    }
    // Still held, the garbage collected: what the waiters hold.
    const objects = await inspector.collectedHeapMb();
    const held = rssMb(api.child.pid!);
    const objectsHeld = objects.heap + objects.external - objectsBefore.heap - objectsBefore.external;
    for (const s of sockets) s.destroy();
    const calls = provider.journal.filter((e) => e.json?.messages?.[0]?.content === 'large').length;
    process.stderr.write(`      (answer ${(body.length / 1048576).toFixed(1)} MB, ${calls} provider call; API RSS before ${before.toFixed(0)} MB, with ${WAITERS} waiters held ${held.toFixed(0)} MB collected (+${(held - before).toFixed(0)}; heap and Buffers +${objectsHeld.toFixed(1)}), uncollected peak ${peak.toFixed(0)} MB (+${(peak - before).toFixed(0)}))\n`);
    expect(calls).to.equal(1);
    // And the answer read back in slices is the provider's, byte for byte.
    const whole = await rawRequest(`${api.url}/${t.tenancy}/${t.namespace}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: request,
    });
    expect(whole.status).to.equal(200);
    expect(whole.body.equals(Buffer.from(body))).to.equal(true);
    // Read whole per waiter, as before the answer was paged, this was +549 MB; paged, the
    // uncollected peak measures +23 to +98 MB, the spread being how lazily V8 collects the
    // slices' garbage in a fresh process. Bounded on what stays after a collection: the heap
    // and Buffers exactly, RSS loosely (how much the allocator takes from the system depends
    // on what it kept before: +28 to +52 MB seen; the heap and Buffers, +3.7 MB).
    expect(objectsHeld, 'heap and Buffers held with the waiters, MB').to.be.at.most(16);
    expect(held - before, 'RSS growth with the waiters held, MB').to.be.at.most(128);
  });
});
