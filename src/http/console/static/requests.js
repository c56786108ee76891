// A namespace's requests: the listing (newest first, cursor paging, filters), one request's page
// (record, bodies pretty and raw, a stream followed live through the replay), usage.
import { h, api, fmt, bars, pagedTable, field, table } from './lib.js';
import { page, NS, flash, canWrite, attempt, route } from './app.js';

const statusPill = (s, expired) => h('span', { class: `pill ${expired ? '' : s}` }, expired ? 'swept' : s);
const nsLink = (ns, rest = '') => `#/ns/${encodeURIComponent(ns)}${rest}`;
// A request the response cache answered from another's stored answer.
const cachedPill = () => h('span', { class: 'pill cached', title: 'answered from the response cache' }, 'cached');
const STATUSES = ['pending', 'running', 'succeeded', 'failed'];
const DIALECTS = ['chat', 'messages', 'responses'];

// datetime-local speaks the browser's local time without an offset; the listing takes instants.
const toInstant = (local) => (local ? new Date(local).toISOString() : '');
function toLocal(instant) {
  const d = new Date(instant);
  if (!instant || Number.isNaN(d.getTime())) return '';
  return new Date(d.getTime() - d.getTimezoneOffset() * 60_000).toISOString().slice(0, 16);
}

/** The listing's filters as a form; applying them puts them in the address, so a filtered listing is a link. */
function filterForm(ns, filters, keys) {
  const form = h(
    'form',
    { class: 'card inline filters', 'aria-label': 'Filter requests' },
    field('Status', { name: 'status', value: filters.get('status') ?? '', options: [['', 'Any status'], ...STATUSES.map((s) => [s, s])] }),
    field('Model', { name: 'model', value: filters.get('model') ?? '', placeholder: 'gpt-4o-mini' }),
    field('Dialect', { name: 'dialect', value: filters.get('dialect') ?? '', options: [['', 'Any dialect'], ...DIALECTS.map((d) => [d, d])] }),
    field('Key', { name: 'api_key_id', value: filters.get('api_key_id') ?? '', options: [['', 'Any key'], ...keys.map((k) => [k.api_key_id, `${k.name} (${k.prefix})${k.revoked_at ? ' · revoked' : ''}`])] }),
    field('Created from', { name: 'created_since', type: 'datetime-local', value: toLocal(filters.get('created_since')) }),
    field('Created before', { name: 'created_before', type: 'datetime-local', value: toLocal(filters.get('created_before')) }),
    h('div', { class: 'buttons' },
      h('button', { type: 'submit', class: 'primary' }, 'Apply filters'),
      h('button', { type: 'button', onclick: () => (location.hash = nsLink(ns, '/requests')) }, 'Clear filters')),
  );
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const next = new URLSearchParams();
    for (const [name, value] of new FormData(form)) {
      const v = name.startsWith('created_') ? toInstant(value) : value.trim();
      if (v) next.set(name, v);
    }
    const query = next.toString();
    location.hash = nsLink(ns, `/requests${query ? `?${query}` : ''}`);
  });
  return form;
}

export async function requestsPage(ns, query = '') {
  const filters = new URLSearchParams(query);
  const { data: keys } = await api('GET', `${NS(ns)}/api-keys`);
  const [body, more] = await pagedTable('Requests', [
    ['Request', (r) => h('a', { href: nsLink(ns, `/requests/${r.request_id}`) }, h('code', {}, r.request_id))],
    ['Status', (r) => [statusPill(r.status, r.expired), r.cached_from ? [' ', cachedPill()] : null]],
    ['Model', (r) => r.model ?? '—'],
    ['Kind', (r) => `${r.dialect}${r.streaming ? ' · stream' : ''}`],
    ['Key', (r) => (r.api_key_prefix ? h('code', {}, r.api_key_prefix) : '—')],
    ['Tokens', (r) => fmt.int(r.total_tokens)],
    ['Batch', (r) => (r.batch_id ? h('a', { href: nsLink(ns, `/batches/${r.batch_id}`) }, h('code', {}, r.batch_id)) : '')],
    ['Created', (r) => fmt.time(r.created_at)],
  ], async (after) => {
    const q = new URLSearchParams(filters);
    q.set('limit', '50');
    if (after) q.set('after', after);
    return api('GET', `${NS(ns)}/requests?${q}`);
  }, {
    empty: filters.size > 0 ? 'No requests match these filters.' : 'No requests yet. Call a model with one of this namespace’s keys.',
    more: 'Older requests',
    onError: (e) => flash(e.message, 'error'),
  });
  page(`Requests in ${ns}`, h('p', { class: 'subnav' }, h('a', { href: nsLink(ns) }, `← ${ns}`), h('a', { href: nsLink(ns, '/usage') }, 'Usage and storage')),
    filterForm(ns, filters, keys), findResponseForm(ns), body, more);
}

/** Finds a Responses request by the provider's resp_ id (what a caller of the background routes holds) or Sarsen's id. */
function findResponseForm(ns) {
  const form = h('form', { class: 'card inline', 'aria-label': 'Find a response' },
    field('Response id', { name: 'response_id', placeholder: 'resp_… or req_…' }),
    h('div', { class: 'buttons' }, h('button', { type: 'submit' }, 'Find response')));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const id = String(new FormData(form).get('response_id') ?? '').trim();
    if (!id) return;
    const found = await api('GET', `${NS(ns)}/responses/${encodeURIComponent(id)}`).catch((err) => {
      flash(err.status === 404 ? `No response ${id} in ${ns}.` : err.message, 'error');
      return null;
    });
    if (found) location.hash = nsLink(ns, `/requests/${found.request_id}`);
  });
  return form;
}

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** A body with a Pretty / Raw switch; raw is the stored text itself. */
function bodyView(title, text) {
  const pre = h('pre', { class: 'body', tabindex: 0, 'aria-label': `${title} (pretty)` }, pretty(text));
  let raw = false;
  const toggle = h('button', { class: 'link', 'aria-pressed': 'false' }, 'Raw');
  toggle.addEventListener('click', () => {
    raw = !raw;
    pre.textContent = raw ? text : pretty(text);
    pre.setAttribute('aria-label', `${title} (${raw ? 'raw' : 'pretty'})`);
    toggle.setAttribute('aria-pressed', String(raw));
  });
  return h('section', { class: 'card' }, h('header', { class: 'row' }, h('h2', {}, title), toggle), pre);
}

export async function requestPage(ns, id) {
  const back = h('p', { class: 'subnav' }, h('a', { href: nsLink(ns, '/requests') }, '← Requests'));
  // The listing row (timings, tokens, cost) comes by id, however the page was reached; it
  // outlives the sweep, which answers the record itself with 410.
  const [row, record] = await Promise.all([summary(ns, id), api('GET', `${NS(ns)}/requests/${encodeURIComponent(id)}`).catch((err) => {
    if (err.status === 410) return null;
    throw err;
  })]);
  if (record === null) {
    page(`Request ${id}`, back, h('p', { class: 'notice' }, 'Swept: retention removed this request’s bodies and answer. The listing keeps its metadata:'), facts(row, null, ns));
    return;
  }
  // A Responses request: whether it runs in the background, and the provider's id of each attempt.
  const ids = record.dialect === 'responses' ? await api('GET', `${NS(ns)}/responses/${encodeURIComponent(id)}`).catch(() => null) : null;
  let shownFacts = facts(row, record, ns, ids);
  const parts = [back, shownFacts];
  if (canWrite() && (record.status === 'pending' || record.status === 'running')) {
    parts.push(h('p', {}, h('button', { class: 'danger', onclick: async () => {
      if (!confirm(`Cancel request ${id}? It ends failed; what it produced so far is kept.`)) return;
      if (await attempt(() => api('POST', `${NS(ns)}/requests/${encodeURIComponent(id)}/cancel`))) {
        flash(`Request ${id} cancelled.`);
        route();
      }
    } }, 'Cancel request')));
  }
  if (record.status === 'failed') {
    parts.push(h('p', { class: 'notice error' }, `Refused or failed with status ${record.error_status ?? '—'}`,
      record.retry_after ? `; the provider asked to retry after ${record.retry_after}` : '', '.'));
  }
  const requestBody = await api('GET', `${NS(ns)}/requests/${encodeURIComponent(id)}/body`, undefined, { raw: true }).catch(() => null);
  if (requestBody !== null) parts.push(bodyView('Request body', requestBody));
  if (record.streaming) {
    // When the stream ends, the status, timings and tokens are read again.
    parts.push(streamView(ns, id, async () => {
      const [now, row] = await Promise.all([api('GET', `${NS(ns)}/requests/${encodeURIComponent(id)}`), summary(ns, id)]);
      const fresh = facts(row, now, ns, ids);
      shownFacts.replaceWith(fresh);
      shownFacts = fresh;
    }));
  }
  else {
    const answer = await api('GET', `${NS(ns)}/requests/${encodeURIComponent(id)}/answer`, undefined, { raw: true }).catch(() => null);
    parts.push(answer === null ? h('p', { class: 'muted' }, 'No answer stored yet.') : bodyView('Answer', answer));
  }
  page(`Request ${id}`, ...parts);
}

const summary = (ns, id) => api('GET', `${NS(ns)}/requests/${encodeURIComponent(id)}/summary`);

function facts(row, record, ns, ids = null) {
  const items = [
    ['Status', record ? statusPill(record.status, false) : statusPill(row?.status, row?.expired)],
    ['Model', row?.model ?? '—'],
    ['Dialect', record?.dialect ?? row?.dialect],
    ['Streamed', (record?.streaming ?? row?.streaming) ? 'yes' : 'no'],
    ['Attempts', String(record?.attempts ?? row?.attempts ?? '—')],
    ['Recoveries', String(record?.recoveries ?? row?.recoveries ?? '—')],
    ['Created', fmt.time(row?.created_at)],
    ['Waited', fmt.ms(row?.created_at, row?.started_at)],
    ['Took', fmt.ms(row?.started_at, row?.finished_at)],
    ['Tokens', row ? `${fmt.int(row.prompt_tokens)} in · ${fmt.int(row.completion_tokens)} out` : '—'],
    ['Cost', fmt.credits(row?.cost)],
    ['Stored', fmt.bytes(row?.stored_bytes)],
  ];
  if (record?.next_retry_at) items.push(['Next retry', fmt.time(record.next_retry_at)]);
  const from = row?.cached_from ?? record?.cached_from;
  if (from) items.push(['Cached from', h('a', { href: nsLink(ns, `/requests/${from}`) }, h('code', {}, from))]);
  if (ids) {
    items.push(['Background', ids.background ? 'yes' : 'no']);
    items.push(['Response ids', ids.response_ids.length === 0 ? '—' : ids.response_ids.map((r, i) => [i ? ', ' : '', h('code', {}, r.id), ` (attempt ${r.attempt})`])]);
  }
  return h('dl', { class: 'facts card' }, items.map(([k, v]) => h('div', {}, h('dt', {}, k), h('dd', {}, v))));
}

/** Text a frame adds: a chat delta, a messages text delta or a responses output text delta. */
function frameText(data) {
  try {
    const v = JSON.parse(data);
    if (v.type === 'response.output_text.delta') return v.delta ?? '';
    return v.choices?.[0]?.delta?.content ?? (v.type === 'content_block_delta' ? v.delta?.text : '') ?? '';
  } catch {
    return '';
  }
}

// EventSource hands a frame with an `event:` line only to listeners of that name: the named
// events of the messages and responses dialects (chat frames have none and arrive as 'message').
const NAMED_EVENTS = [
  'message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop', 'ping',
  'response.created', 'response.queued', 'response.in_progress', 'response.completed', 'response.incomplete', 'response.failed',
  'response.output_item.added', 'response.output_item.done', 'response.content_part.added', 'response.content_part.done',
  'response.output_text.delta', 'response.output_text.done', 'response.output_text.annotation.added',
  'response.refusal.delta', 'response.refusal.done', 'response.function_call_arguments.delta', 'response.function_call_arguments.done',
  'response.reasoning_summary_part.added', 'response.reasoning_summary_part.done', 'response.reasoning_summary_text.delta',
  'response.reasoning_summary_text.done', 'response.reasoning_text.delta', 'response.reasoning_text.done',
];

function streamView(ns, id, onEnd) {
  const state = h('p', { class: 'pill running', role: 'status' }, 'following live…');
  const text = h('pre', { class: 'body assembled', 'aria-label': 'Assembled text' });
  const frames = h('ol', { class: 'frames', 'aria-label': 'Frames' });
  let es;
  let got = 0;
  let ended = false;
  const end = (label, kind) => {
    ended = true;
    es.close();
    state.className = `pill ${kind}`;
    state.textContent = label;
    onEnd().catch(() => {});
  };
  // The replay sends the stored frames, then the live tail, then ends the connection.
  const follow = () => {
    es = new EventSource(`${NS(ns)}/requests/${encodeURIComponent(id)}`);
    const onFrame = (e) => {
      got++;
      frames.append(h('li', {}, h('span', { class: 'seq' }, e.lastEventId || '·'), h('code', {}, e.data)));
      text.textContent += frameText(e.data);
    };
    for (const name of ['message', ...NAMED_EVENTS]) es.addEventListener(name, onFrame);
    es.addEventListener('failed', (e) => {
      let detail = {};
      try {
        detail = JSON.parse(e.data);
      } catch {}
      if (detail.status === 'superseded') {
        // Another worker took the request over: the frames so far no longer count; read the new attempt.
        for (const li of frames.children) li.classList.add('superseded');
        frames.append(h('li', { class: 'superseded' }, h('span', { class: 'seq' }, '—'), 'attempt superseded: the frames above were discarded; following the new attempt'));
        text.textContent = '';
        es.close();
        follow();
      } else {
        frames.append(h('li', { class: 'failed' }, h('span', { class: 'seq' }, '—'), h('code', {}, e.data)));
        end('stream failed', 'failed');
      }
    });
    es.addEventListener('error', (e) => {
      // A provider's own `event: error` frame (the responses dialect has one) carries data.
      if (typeof e.data === 'string') return onFrame(e);
      if (!ended && es.readyState !== EventSource.OPEN) end(got > 0 ? 'stream complete' : 'stream ended', 'succeeded');
    });
  };
  follow();
  addEventListener('hashchange', () => es.close(), { once: true });
  return h('section', { class: 'card' }, h('header', { class: 'row' }, h('h2', {}, 'Stream'), state), h('h3', {}, 'Assembled text'), text, h('h3', {}, 'Frames'), frames);
}

const WINDOWS = [['1 hour', 3600e3], ['24 hours', 86400e3], ['7 days', 7 * 86400e3], ['30 days', 30 * 86400e3]];

export async function usagePage(ns, windowMs = 86400e3) {
  const since = Date.now() - windowMs;
  const [usage, storage, keys] = await Promise.all([
    api('GET', `${NS(ns)}/usage?since=${Math.floor(since)}`),
    api('GET', `${NS(ns)}/storage`),
    api('GET', `${NS(ns)}/api-keys`),
  ]);
  const keyName = new Map(keys.data.map((k) => [k.api_key_id, k.name]));
  const label = (k) => keyName.get(k.api_key_id) ?? k.api_key_id;
  const saved = usage.accepted_submissions - usage.provider_calls - usage.cache_hits;
  const picker = h('div', { class: 'buttons', role: 'group', 'aria-label': 'Window' }, WINDOWS.map(([name, ms]) =>
    h('button', { 'aria-pressed': String(ms === windowMs), onclick: () => usagePage(ns, ms).catch((e) => flash(e.message, 'error')) }, name)));
  page(
    `Usage and storage in ${ns}`,
    h('p', { class: 'subnav' }, h('a', { href: nsLink(ns) }, `← ${ns}`), h('a', { href: nsLink(ns, '/requests') }, 'Requests')),
    h('section', { class: 'stats' },
      stat('Accepted submissions', fmt.int(usage.accepted_submissions)),
      stat('Provider calls', fmt.int(usage.provider_calls)),
      stat('Saved by deduplication', fmt.int(saved), 'deduplication-saved'),
      stat('Answered from the cache', fmt.int(usage.cache_hits), 'cache-hits'),
      stat('Stored', fmt.bytes(storage.stored_bytes))),
    h('h2', {}, 'Rate limits this minute'),
    table('Rate limits', [
      ['Key', (w) => label(w)],
      ['Requests', (w) => `${fmt.int(w.window.requests)}${w.requests_per_minute !== null ? ` of ${fmt.int(w.requests_per_minute)}` : ''}`],
      ['Tokens', (w) => `${fmt.int(w.window.tokens)}${w.tokens_per_minute !== null ? ` of ${fmt.int(w.tokens_per_minute)}` : ''}`],
      ['Refused', (w) => fmt.int(w.window.refused)],
    ], usage.rate_limits, 'No key of this namespace has a rate limit.'),
    h('h2', {}, 'Per key'),
    picker,
    h('div', { class: 'charts' },
      bars('Tokens per key', usage.api_keys.map((k) => [label(k), k.total_tokens ?? 0])),
      bars('Provider calls per key', usage.api_keys.map((k) => [label(k), k.provider_calls]))),
    h('h2', {}, 'Storage'),
    h('div', { class: 'charts' },
      bars('Bytes by kind', [['Requests', storage.request_bytes], ['Answers', storage.response_bytes], ['Stream frames', storage.chunk_bytes]], fmt.bytes)),
  );
}

function stat(name, value, id) {
  return h('div', { class: 'stat card', 'aria-label': name, 'data-stat': id }, h('span', { class: 'value' }, value), h('span', { class: 'name' }, name));
}
