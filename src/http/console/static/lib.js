// Small helpers for the console's pages: elements built with textContent only (no HTML
// strings, so nothing a record holds can become markup), the API caller, formatting.

/** h('button', { onclick, class: 'x' }, 'text', child...) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export class ApiError extends Error {
  constructor(status, code, message, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

let onUnauthorised = () => {};
export function whenSignedOut(fn) {
  onUnauthorised = fn;
}

/** One call to a Sarsen route with the session cookie; errors carry the envelope's message. */
export async function api(method, path, body, { raw = false } = {}) {
  const init = { method, credentials: 'same-origin', headers: {} };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.ok) {
    if (res.status === 204) return null;
    return raw ? res.text() : res.json();
  }
  let code = 'error';
  let message = `HTTP ${res.status}`;
  try {
    const env = await res.json();
    code = env.error?.code ?? code;
    message = env.error?.message ?? message;
  } catch {}
  const err = new ApiError(res.status, code, message, res.headers.get('retry-after'));
  if (res.status === 401 && !path.includes('/sessions')) onUnauthorised(err);
  throw err;
}

export function formData(form) {
  return Object.fromEntries(new FormData(form).entries());
}

export const fmt = {
  time: (t) => (t ? new Date(t).toLocaleString() : '—'),
  int: (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString()),
  bytes(n) {
    if (n === null || n === undefined) return '—';
    const units = ['B', 'KB', 'MB', 'GB', 'TB'];
    let i = 0;
    let v = Number(n);
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i++;
    }
    return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
  },
  credits: (micros) => (micros === null || micros === undefined ? '—' : `${(Number(micros) / 1e6).toFixed(6)} credits`),
  minutes(m) {
    if (m % 1440 === 0) return `${m / 1440} day${m === 1440 ? '' : 's'}`;
    if (m % 60 === 0) return `${m / 60} hour${m === 60 ? '' : 's'}`;
    return `${m} minute${m === 1 ? '' : 's'}`;
  },
  ms: (a, b) => (a && b ? `${(new Date(b) - new Date(a)).toLocaleString()} ms` : '—'),
};

/** A labelled form field; `input` attributes go to the control. */
export function field(label, attrs = {}, hint) {
  const id = `f-${attrs.name}-${Math.random().toString(36).slice(2, 8)}`;
  const control = attrs.options
    ? h('select', { id, name: attrs.name }, attrs.options.map(([value, text]) => h('option', { value, selected: value === attrs.value }, text)))
    : h('input', { id, type: 'text', ...attrs });
  return h('div', { class: 'field' }, h('label', { for: id }, label), control, hint ? h('small', { class: 'muted' }, hint) : null);
}

/** A table: columns are [heading, row => cell]. */
export function table(caption, columns, rows, empty = 'Nothing yet.') {
  if (rows.length === 0) return h('p', { class: 'empty' }, empty);
  return h(
    'table',
    {},
    h('caption', { class: 'sr-only' }, caption),
    h('thead', {}, h('tr', {}, columns.map(([heading]) => h('th', { scope: 'col' }, heading)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, columns.map(([, cell]) => h('td', {}, cell(r)))))),
  );
}

/**
 * A table fed page by page, newest first: `fetchPage(after)` answers `{data, next_after}`; the
 * button under it loads the next page. Answers [table, button].
 */
export async function pagedTable(caption, columns, fetchPage, { empty, more: label, onError }) {
  const body = h('div', {});
  const more = h('button', { hidden: true }, label);
  const rows = [];
  let after = null;
  const load = async () => {
    const res = await fetchPage(after);
    rows.push(...res.data);
    after = res.next_after;
    more.hidden = after === null;
    body.replaceChildren(table(caption, columns, rows, empty));
  };
  more.addEventListener('click', () => load().catch(onError));
  await load();
  return [body, more];
}

/** A horizontal bar chart: items are [label, value]; values formatted with `format`. */
export function bars(title, items, format = fmt.int) {
  const max = Math.max(1, ...items.map(([, v]) => Number(v) || 0));
  return h(
    'figure',
    { class: 'chart' },
    h('figcaption', {}, title),
    items.length === 0
      ? h('p', { class: 'empty' }, 'No data in this window.')
      : h('dl', {}, items.map(([label, v]) => [
          h('dt', {}, label),
          h('dd', {}, bar(((Number(v) || 0) / max) * 100), h('span', { class: 'value' }, format(v))),
        ])),
  );
}

// Set through the CSSOM: the Content-Security-Policy refuses inline style attributes.
function bar(percent) {
  const el = h('span', { class: 'bar' });
  el.style.setProperty('--w', `${percent}%`);
  return el;
}
