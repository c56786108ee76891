// OpenTelemetry tracing (issue 45; docs/operations.md "Tracing"): real Sarsen processes (an api
// process and two executors) export OTLP/HTTP JSON to a receiver in this test, which decodes
// what arrives. A synchronous call, a stream and POST /requests each give the caller's request
// span, acceptance with its group commit, the attempt (continuing the request's trace in the
// executor process), the provider call in the GenAI conventions and settlement; a caller's
// traceparent is the parent and is never forwarded; an attached body links instead of calling;
// an executor killed mid-stream gives a second attempt, elsewhere, linked to the first trace.
import crypto from 'node:crypto';
import http from 'node:http';
import { expect } from 'chai';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { startOtlpReceiver, type OtlpReceiver, type ExportedSpan } from '../support/otlp-receiver.ts';
import { findLeaks, registerOutput } from '../support/log-guard.ts';

const SERVER = 2;
const CLIENT = 3;
const CONSUMER = 5;

function replayer(url: string, key: string): { text: () => string; done: Promise<string> } {
  let text = '';
  const done = new Promise<string>((resolve, reject) => {
    const req = http.get(url, { headers: { accept: 'text/event-stream', 'x-sarsen-key': key }, agent: false }, (res) => {
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => resolve(text));
      res.on('error', reject);
    });
    req.on('error', reject);
  });
  return { text: () => text, done };
}

describe('OpenTelemetry tracing across processes', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let receiver: OtlpReceiver;
  let d: Deployment;
  let api: SarsenProcess;
  let executors: SarsenProcess[];
  let t: Tenant;
  // Text that must never leave in the exported data: every prompt sent.
  const prompts: string[] = [];
  const prompt = (label: string) => {
    const text = `secret-prompt-${label}-${crypto.randomBytes(8).toString('hex')}`;
    prompts.push(text);
    return text;
  };

  const otel = (service: string) => ({
    OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
    OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
    OTEL_BSP_SCHEDULE_DELAY: '50',
    OTEL_SERVICE_NAME: service,
  });

  before(async () => {
    provider = await startFakeProvider();
    receiver = await startOtlpReceiver();
    d = await startDeployment({ lease_ms: 5000, heartbeat_ms: 1000, sweep_interval_ms: 100 });
    api = await d.start('api', otel('sarsen-api'));
    executors = [await d.start('executor', otel('sarsen-executor')), await d.start('executor', otel('sarsen-executor'))];
    t = await provision(d.asServer(api), provider);
  });
  after(async () => {
    for (const p of [api, ...(executors ?? [])]) await p?.kill('SIGTERM');
    await d?.close();
    await provider?.close();
    await receiver?.close();
  });

  const post = (path: string, body: object, headers: Record<string, string> = {}) =>
    rawRequest(`${t.base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key, ...headers }, body: JSON.stringify(body) });

  const one = (spans: ExportedSpan[], pred: (s: ExportedSpan) => boolean): ExportedSpan | undefined => spans.find(pred);
  const childrenOf = (parent: ExportedSpan, name?: string) =>
    receiver.spans.filter((s) => s.traceId === parent.traceId && s.parentSpanId === parent.spanId && (name === undefined || s.name === name));

  /** Waits for a request's whole trace as the api and executor processes export it. */
  async function traceOf(requestId: string, route: string) {
    return receiver.until((spans) => {
      const server = one(spans, (s) => s.kind === SERVER && s.attributes['sarsen.request.id'] === requestId && s.name === `POST ${route}`);
      const attempt = one(spans, (s) => s.name === 'sarsen.attempt' && s.attributes['sarsen.request.id'] === requestId);
      if (!server || !attempt) return undefined;
      const call = one(spans, (s) => s.kind === CLIENT && s.parentSpanId === attempt.spanId);
      const settle = one(spans, (s) => s.name === 'sarsen.settle' && s.parentSpanId === attempt.spanId);
      const accept = one(spans, (s) => s.name === 'sarsen.accept' && s.parentSpanId === server.spanId);
      return call && settle && accept ? { server, accept, attempt, call, settle } : undefined;
    });
  }

  it('a synchronous call joins the caller\'s traceparent: request, acceptance, attempt, provider call and settlement, in the GenAI conventions; the header is not forwarded', async () => {
    const callerTrace = crypto.randomBytes(16).toString('hex');
    const callerSpan = crypto.randomBytes(8).toString('hex');
    const res = await post('/chat/completions', { model: 'gpt-test', messages: [{ role: 'user', content: prompt('sync') }] }, { traceparent: `00-${callerTrace}-${callerSpan}-01` });
    expect(res.status).to.equal(200);
    const answer = json(res);
    const { rows } = await d.pool.query(`SELECT id FROM sarsen.requests ORDER BY id DESC LIMIT 1`);
    const id = rows[0].id as string;

    const { server, accept, attempt, call, settle } = await traceOf(id, '/:tenancy/:namespace/v1/chat/completions');
    expect(server.traceId).to.equal(callerTrace);
    expect(server.parentSpanId).to.equal(callerSpan);
    expect(server.resource['service.name']).to.equal('sarsen-api');
    expect(server.attributes).to.include({ 'http.request.method': 'POST', 'http.response.status_code': 200, 'sarsen.attached': false, 'sarsen.cache.hit': false, 'sarsen.dialect': 'chat', 'sarsen.rate_limit': 'none' });
    expect(server.attributes['sarsen.key.prefix']).to.equal(t.key.split('_')[1]);
    expect(server.attributes['sarsen.namespace']).to.equal(t.namespace);
    // Acceptance and its group commit.
    expect(accept.attributes['sarsen.group_commit.batch_size']).to.be.a('number').at.least(1);
    expect(accept.attributes['sarsen.group_commit.wait_ms']).to.be.a('number');
    expect(accept.events.map((e) => e.name)).to.deep.equal(['sarsen.group_commit.flush', 'sarsen.group_commit.committed']);
    // The attempt, in an executor process, continues the caller's trace under the request's span.
    expect(attempt.traceId).to.equal(callerTrace);
    expect(attempt.parentSpanId).to.equal(server.spanId);
    expect(attempt.kind).to.equal(CONSUMER);
    expect(attempt.resource['service.name']).to.equal('sarsen-executor');
    expect(attempt.attributes).to.include({ 'sarsen.attempt': 1, 'sarsen.recoveries': 0, 'sarsen.dialect': 'chat', 'sarsen.outcome': 'succeeded' });
    // The provider call, a client span in the GenAI conventions.
    expect(call.name).to.equal('chat gpt-test');
    expect(call.attributes).to.deep.include({
      'gen_ai.operation.name': 'chat',
      'gen_ai.provider.name': 'openai',
      'gen_ai.request.model': 'gpt-test',
      'gen_ai.response.model': answer.model,
      'gen_ai.response.id': answer.id,
      'gen_ai.response.finish_reasons': ['stop'],
      'gen_ai.usage.input_tokens': answer.usage.prompt_tokens,
      'gen_ai.usage.output_tokens': answer.usage.completion_tokens,
      'http.response.status_code': 200,
      'server.address': '127.0.0.1',
    });
    expect(settle.attributes['sarsen.outcome']).to.equal('succeeded');
    expect(settle.attributes['sarsen.group_commit.batch_size']).to.be.a('number').at.least(1);
    // The caller's trace context goes no further than Sarsen.
    const sent = provider.journal[provider.journal.length - 1]!;
    expect(Object.keys(sent.headers)).to.not.include('traceparent');
    // Log lines written inside the traced request carry its ids.
    const logged = api.output().split('\n').filter((l) => l.includes(`"request_id":"${id}"`) && l.includes('"message":"request"'));
    expect(logged, api.output().slice(-2000)).to.have.length(1);
    expect(JSON.parse(logged[0]!)).to.include({ trace_id: callerTrace, span_id: server.spanId });
  });

  it('a stream: the first frame and the commits that made frames durable are events and counts on the provider call, not a span per frame', async () => {
    const res = await post('/chat/completions', { model: 'gpt-test', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: prompt('stream') }] });
    expect(res.status).to.equal(200);
    const { rows } = await d.pool.query(`SELECT id FROM sarsen.requests ORDER BY id DESC LIMIT 1`);
    const { server, attempt, call } = await traceOf(rows[0].id, '/:tenancy/:namespace/v1/chat/completions');
    expect(server.parentSpanId).to.equal(''); // no caller trace: the request's span is the root
    expect(attempt.traceId).to.equal(server.traceId);
    expect(attempt.attributes['sarsen.streaming']).to.equal(true);
    const frames = res.body.toString('utf8').split('\n\n').filter((f) => f.startsWith('data:')).length;
    expect(call.attributes).to.include({ 'sarsen.stream.frames': frames, 'sarsen.stream.frames_committed': frames, 'gen_ai.response.id': 'chatcmpl-fake-' + provider.journal.length });
    expect(call.attributes['sarsen.stream.commits']).to.be.a('number').within(1, frames);
    expect(call.attributes['gen_ai.response.finish_reasons']).to.deep.equal(['stop']);
    expect(call.attributes['gen_ai.usage.output_tokens']).to.be.a('number');
    const events = call.events.map((e) => e.name);
    expect(events[0]).to.equal('sarsen.first_frame');
    expect(events).to.include.members(['sarsen.first_frame_committed', 'sarsen.last_frame_committed']);
    expect(childrenOf(call)).to.have.length(0);
  });

  it('POST /requests: the request\'s span ends at 202; the attempt later continues its trace', async () => {
    const res = await post('/requests?dialect=messages', { model: 'claude-test', max_tokens: 16, messages: [{ role: 'user', content: prompt('requests') }] });
    expect(res.status).to.equal(202);
    const id = json(res).request_id as string;
    const { server, accept, attempt, call } = await traceOf(id, '/:tenancy/:namespace/v1/requests');
    expect(server.attributes['http.response.status_code']).to.equal(202);
    expect(accept.attributes['sarsen.dialect']).to.equal('messages');
    expect(attempt.parentSpanId).to.equal(server.spanId);
    expect(call.attributes).to.deep.include({ 'gen_ai.provider.name': 'anthropic', 'gen_ai.request.model': 'claude-test', 'gen_ai.response.finish_reasons': ['end_turn'] });
  });

  it('a replay by id is a span of its own, linked to the request\'s trace', async () => {
    const res = await post('/requests', { model: 'gpt-test', stream: true, messages: [{ role: 'user', content: prompt('replay') }] });
    const id = json(res).request_id as string;
    const original = await traceOf(id, '/:tenancy/:namespace/v1/requests');
    const replayed = await replayer(`${t.base}/requests/${id}`, t.key).done;
    expect(replayed).to.match(/^id: 1\n/);
    const span = await receiver.until((spans) => one(spans, (s) => s.name === 'sarsen.replay' && s.attributes['sarsen.request.id'] === id));
    const reader = one(receiver.spans, (s) => s.spanId === span.parentSpanId)!;
    expect(reader.name).to.equal('GET /:tenancy/:namespace/v1/requests/:id');
    expect(span.traceId).to.not.equal(original.server.traceId);
    expect(span.links).to.deep.equal([{ traceId: original.server.traceId, spanId: original.server.spanId, attributes: { 'sarsen.link': 'replay_of' } }]);
  });

  it('an identical body that attached links to the running execution\'s trace, and makes no second provider call', async () => {
    const body = { model: 'gpt-test', messages: [{ role: 'user', content: prompt('attach') }] };
    const first = await post('/requests', body);
    const second = await post('/requests', body);
    const id = json(first).request_id as string;
    expect(json(second).request_id).to.equal(id);
    const original = await traceOf(id, '/:tenancy/:namespace/v1/requests');
    const attached = await receiver.until((spans) =>
      one(spans, (s) => s.kind === SERVER && s.attributes['sarsen.request.id'] === id && s.attributes['sarsen.attached'] === true));
    expect(attached.traceId).to.not.equal(original.server.traceId);
    expect(attached.links).to.deep.equal([{ traceId: original.server.traceId, spanId: original.server.spanId, attributes: { 'sarsen.link': 'attached_to' } }]);
    // One execution: one attempt, one provider call, whichever trace one looks in.
    const attempts = receiver.spans.filter((s) => s.name === 'sarsen.attempt' && s.attributes['sarsen.request.id'] === id);
    expect(attempts).to.have.length(1);
    expect(receiver.spans.filter((s) => s.kind === CLIENT && s.traceId === attached.traceId)).to.have.length(0);
    expect(childrenOf(attempts[0]!).filter((s) => s.kind === CLIENT)).to.have.length(1);
    expect(provider.journal.filter((e) => JSON.stringify(e.json).includes(body.messages[0]!.content))).to.have.length(1);
  });

  it('an executor SIGKILLed mid-stream: the second attempt runs in another process, in a trace linked to the first, with recoveries = 1', async () => {
    let calls = 0;
    const undo = provider.rule((entry) => {
      if (!JSON.stringify(entry.json ?? {}).includes('survive-')) return undefined;
      calls++;
      return { kind: 'sse', frames: chatFrames(Array.from({ length: 40 }, (_, i) => `call${calls}-piece${i} `), { usage: true }), frameDelayMs: 50 };
    });
    try {
      const res = await post('/requests', { model: 'gpt-test', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: prompt('survive') }] });
      const id = json(res).request_id as string;
      const reader = replayer(`${t.base}/requests/${id}`, t.key);
      await until(async () => (reader.text().match(/^id: /gm)?.length ?? 0) >= 5 || undefined);
      const { rows } = await d.pool.query(`SELECT lease_owner FROM sarsen.requests WHERE id = $1`, [id]);
      const victim = executors.find((e) => e.owner === rows[0].lease_owner)!;
      const survivor = executors.find((e) => e !== victim)!;
      await victim.kill('SIGKILL');
      await reader.done;
      await until(async () => ((await d.pool.query(`SELECT status FROM sarsen.requests WHERE id = $1`, [id])).rows[0].status === 'succeeded' ? true : undefined), 60_000);

      const server = await receiver.until((spans) => one(spans, (s) => s.kind === SERVER && s.attributes['sarsen.request.id'] === id && s.name.endsWith('/requests')));
      const recovered = await receiver.until((spans) => one(spans, (s) => s.name === 'sarsen.attempt' && s.attributes['sarsen.request.id'] === id && s.attributes['sarsen.attempt'] === 2));
      expect(recovered.attributes).to.include({ 'sarsen.recoveries': 1, 'sarsen.outcome': 'succeeded' });
      expect(recovered.resource['process.pid']).to.equal(survivor.child.pid);
      expect(recovered.parentSpanId).to.equal('');
      expect(recovered.traceId).to.not.equal(server.traceId);
      expect(recovered.links).to.deep.equal([{ traceId: server.traceId, spanId: server.spanId, attributes: { 'sarsen.link': 'recovered_from' } }]);
      const call = await receiver.until((spans) => one(spans, (s) => s.kind === CLIENT && s.parentSpanId === recovered.spanId));
      expect(call.attributes['sarsen.stream.frames']).to.equal(44); // role, 40 pieces, finish, usage, [DONE]
    } finally {
      undo();
    }
  });

  it('no credential, key or prompt appears anywhere in what was exported', async () => {
    expect(receiver.bodies.length).to.be.greaterThan(0);
    const secrets = [t.key, t.key.split('_')[2]!, t.chatCredential, t.messagesCredential, t.adminToken, ...prompts];
    const leaks = findLeaks(receiver.bodies, secrets);
    expect(leaks.map((l) => l.secret)).to.deep.equal([]);
    // And the log guard checks every exported body at the end of the run, as it checks log lines.
    for (const body of receiver.bodies) registerOutput(body);
  });
});

describe('OpenTelemetry tracing in one process (role both: run where accepted)', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let receiver: OtlpReceiver;
  let d: Deployment;
  let both: SarsenProcess;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    receiver = await startOtlpReceiver();
    d = await startDeployment();
    both = await d.start('both', { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_BSP_SCHEDULE_DELAY: '50' });
    t = await provision(d.asServer(both), provider);
  });
  after(async () => {
    if (both) expect((await both.kill('SIGTERM')).code).to.equal(0);
    await d?.close();
    await provider?.close();
    await receiver?.close();
  });

  it('the attempt claimed in the acceptance commit continues the request\'s trace; the GenAI client metrics count the call', async () => {
    const res = await rawRequest(`${t.base}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'one process' }] }),
    });
    expect(res.status).to.equal(200);
    const usage = json(res).usage;
    const { attempt, server, call } = await receiver.until((spans) => {
      const server = spans.find((s) => s.kind === SERVER && s.name.endsWith('/chat/completions'));
      const attempt = server && spans.find((s) => s.name === 'sarsen.attempt' && s.parentSpanId === server.spanId);
      const call = attempt && spans.find((s) => s.kind === CLIENT && s.parentSpanId === attempt.spanId);
      return call ? { server, attempt, call } : undefined;
    });
    expect(attempt.traceId).to.equal(server.traceId);
    expect(attempt.resource['process.pid']).to.equal(server.resource['process.pid']);
    expect(call.attributes['gen_ai.usage.input_tokens']).to.equal(usage.prompt_tokens);

    const metrics = (await rawRequest(`${both.url}/metrics`)).body.toString('utf8');
    const labels = 'gen_ai_operation_name="chat",gen_ai_provider_name="openai"';
    expect(metrics).to.include(`gen_ai_client_token_usage_sum{${labels},gen_ai_token_type="input"} ${usage.prompt_tokens}`);
    expect(metrics).to.include(`gen_ai_client_token_usage_sum{${labels},gen_ai_token_type="output"} ${usage.completion_tokens}`);
    expect(metrics).to.match(new RegExp(`gen_ai_client_operation_duration_seconds_count\\{${labels},error_type=""\\} 1\\n`));
  });
});
