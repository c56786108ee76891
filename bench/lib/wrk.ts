// wrk as the load generator of the side-by-side benchmark: a C program whose own CPU cost is a
// small fraction of a Node load generator's, so the proxies get the cores. Every request body is
// distinct (`{n}` in the template becomes a token of the run, the thread and a per-thread
// counter), so a proxy that deduplicates never answers from storage. Results come from a Lua
// `done` hook, exactly.
import fs from 'node:fs';
import crypto from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { execFile, execFileSync } from 'node:child_process';
import { assertLoopback } from './load.ts';

export type WrkOptions = {
  url: string;
  headers: Record<string, string>;
  /** The body, with `{n}` where a per-request distinct token goes. */
  body: string;
  connections: number;
  durationS: number;
  /** A request slower than this counts as a timeout (wrk's --timeout). */
  timeoutS?: number;
  threads?: number;
  signal?: AbortSignal;
};

export type WrkResult = {
  connections: number;
  requests: number;
  rate: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Requests that took over a second (wrk's --timeout ones included). */
  overOneSecond: number;
  /** Answers outside 2xx/3xx, and transport errors and timeouts. */
  non2xx: number;
  errors: { connect: number; read: number; write: number; timeout: number };
};

export function wrkVersion(): string | null {
  try {
    return execFileSync('wrk', ['--version'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).split('\n')[0]!.trim() || 'wrk';
  } catch (err) {
    // `wrk --version` prints its banner and exits 1.
    const out = String((err as { stdout?: unknown }).stdout ?? '');
    return out.startsWith('wrk') ? out.split('\n')[0]!.trim() : null;
  }
}

const luaString = (s: string) => `[==[${s}]==]`;

function script(o: WrkOptions): string {
  // A token per run, so bodies differ across runs of the same template too.
  const [prefix, suffix] = o.body.split('{n}').map((part, i) => (i === 0 ? `${part}${crypto.randomBytes(4).toString('hex')}-` : part));
  if (suffix === undefined) throw new Error('the wrk body template needs a {n}');
  const headers = Object.entries(o.headers).map(([k, v]) => `wrk.headers[ ${luaString(k)} ] = ${luaString(v)}`).join('\n');
  return `
wrk.method = "POST"
${headers}
local threads = 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
local counter = 0
function request()
  counter = counter + 1
  return wrk.format(nil, nil, nil, ${luaString(prefix!)} .. tid .. "-" .. counter .. ${luaString(suffix)})
end
-- wrk's Lua sees its latency distribution only through percentiles: the share of requests
-- over a second is the highest percentile at or under it, found by bisection.
local function shareOver(latency, limit)
  if latency.max <= limit then return 0 end
  local lo, hi = 0, 100
  for _ = 1, 60 do
    local mid = (lo + hi) / 2
    if latency:percentile(mid) <= limit then lo = mid else hi = mid end
  end
  return 1 - lo / 100
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK_RESULT {"requests":%d,"duration_us":%d,"p50":%d,"p90":%d,"p99":%d,"max":%d,"over1s":%.6f,"status":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    shareOver(latency, 1000000), e.status, e.connect, e.read, e.write, e.timeout))
end
`;
}

export async function runWrk(o: WrkOptions): Promise<WrkResult> {
  assertLoopback(new URL(o.url).origin);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-wrk-'));
  const file = path.join(dir, 'load.lua');
  fs.writeFileSync(file, script(o));
  const threads = Math.max(1, Math.min(o.threads ?? 2, o.connections));
  const args = ['-t', String(threads), '-c', String(o.connections), '-d', `${o.durationS}s`, '--timeout', `${o.timeoutS ?? 10}s`, '-s', file, o.url];
  try {
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile('wrk', args, { encoding: 'utf8', signal: o.signal, maxBuffer: 1 << 20 }, (err, out, errOut) => {
        if (err) reject(new Error(`wrk failed: ${err.message}\n${errOut}`));
        else if (!out.includes('WRK_RESULT')) reject(new Error(`wrk printed no result:\n${out}\n${errOut}`));
        else resolve(out);
      });
    });
    const m = /WRK_RESULT (\{.*\})/.exec(stdout);
    if (!m) throw new Error(`wrk printed no result:\n${stdout}`);
    const r = JSON.parse(m[1]!) as Record<string, number>;
    const ms = (us: number) => us / 1000;
    const errors = { connect: r.connect!, read: r.read!, write: r.write!, timeout: r.timeout! };
    return {
      connections: o.connections,
      requests: r.requests!,
      rate: r.requests! / (r.duration_us! / 1e6),
      p50Ms: ms(r.p50!),
      p90Ms: ms(r.p90!),
      p99Ms: ms(r.p99!),
      maxMs: ms(r.max!),
      // Timed-out requests are not in the distribution; each counts once here.
      overOneSecond: Math.round(r.over1s! * r.requests!) + r.timeout!,
      non2xx: r.status!,
      errors,
    };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** "none", or what went wrong: "non-2xx 3, timeout 2". */
export function describeFailures(r: WrkResult): string {
  if (r.requests === 0) return 'nothing completed';
  const parts = [['non-2xx', r.non2xx], ...Object.entries(r.errors)].filter(([, n]) => (n as number) > 0);
  return parts.length === 0 ? 'none' : parts.map(([k, n]) => `${k} ${n}`).join(', ');
}
