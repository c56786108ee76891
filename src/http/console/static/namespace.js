// One namespace's configuration: backends, routing rules (with "which rule takes model X?"),
// API keys with their rate limits, and the response cache.
import { h, api, formData, fmt, field, table } from './lib.js';
import { page, NS, canWrite, attempt, flash, route, session } from './app.js';

const KINDS = [['chat_compat', 'OpenAI-compatible (chat and responses)'], ['messages', 'Anthropic (messages)'], ['aggregator', 'Aggregator (chat and responses)']];

export async function namespacePage(ns) {
  const [namespace, backends, rules, keys] = await Promise.all([
    api('GET', NS(ns)),
    api('GET', `${NS(ns)}/backends`),
    api('GET', `${NS(ns)}/routing-rules`),
    api('GET', `${NS(ns)}/api-keys`),
  ]);
  const backendName = new Map(backends.data.map((b) => [b.backend_id, b.name]));
  page(
    `Namespace ${ns}`,
    h('p', { class: 'subnav' },
      h('a', { href: `#/ns/${encodeURIComponent(ns)}/requests` }, 'Requests'),
      h('a', { href: `#/ns/${encodeURIComponent(ns)}/usage` }, 'Usage and storage'),
      h('a', { href: `#/ns/${encodeURIComponent(ns)}/batches` }, 'Batches'),
      h('span', { class: 'muted' }, 'Base URL for SDKs: ', h('code', {}, `${location.origin}/${encodeURIComponent(session.tenancy)}/${encodeURIComponent(ns)}/v1`))),
    backendSection(ns, backends.data),
    ruleSection(ns, rules.data, backends.data, backendName),
    keySection(ns, keys.data),
    cacheSection(ns, namespace),
  );
}

/** A key's limits for the API: empty fields are off. */
function limitsOf(f) {
  return {
    requests_per_minute: f.requests_per_minute === '' ? null : Number(f.requests_per_minute),
    tokens_per_minute: f.tokens_per_minute === '' ? null : Number(f.tokens_per_minute),
  };
}

const limitWords = (l) =>
  [l.requests_per_minute !== null ? `${fmt.int(l.requests_per_minute)} requests/min` : null, l.tokens_per_minute !== null ? `${fmt.int(l.tokens_per_minute)} tokens/min` : null]
    .filter(Boolean)
    .join(' · ') || 'none';

const limitFields = () => [
  field('Requests per minute', { name: 'requests_per_minute', type: 'number', min: 1 }, 'Empty: no limit.'),
  field('Tokens per minute', { name: 'tokens_per_minute', type: 'number', min: 1 }, 'Input plus output tokens. Empty: no limit.'),
];

function cacheSection(ns, namespace) {
  const form = h(
    'form',
    { class: 'card inline', 'aria-label': 'Response cache' },
    field('Serve cached answers for (minutes)', { name: 'cache_ttl_minutes', type: 'number', min: 1, value: namespace.cache_ttl_minutes ?? '' },
      'Empty: no cache. A repeated request that succeeded within this time is answered from its stored answer, with no provider call.'),
    h('button', { type: 'submit', class: 'primary' }, 'Save cache'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = formData(form);
    const body = { cache_ttl_minutes: f.cache_ttl_minutes === '' ? null : Number(f.cache_ttl_minutes) };
    if (await attempt(() => api('PATCH', NS(ns), body))) {
      flash(body.cache_ttl_minutes === null ? 'Response cache off.' : `Answers are served from the cache for ${fmt.minutes(body.cache_ttl_minutes)}.`);
      route();
    }
  });
  return h(
    'section',
    { 'aria-labelledby': 'h-cache' },
    h('h2', { id: 'h-cache' }, 'Response cache'),
    h('p', { class: 'muted' }, namespace.cache_ttl_minutes === null ? 'Off.' : `On: answers are served for ${fmt.minutes(namespace.cache_ttl_minutes)}.`),
    canWrite() ? form : null,
  );
}

function backendSection(ns, backends) {
  const form = h(
    'form',
    { class: 'card grid', 'aria-label': 'Add or edit a backend' },
    h('input', { type: 'hidden', name: 'backend_id' }),
    field('Backend name', { name: 'name', required: true, placeholder: 'openai' }),
    field('Kind', { name: 'kind', options: KINDS }),
    field('Address', { name: 'address', required: true, placeholder: 'https://api.openai.com/v1' }),
    field('Credential', { name: 'credential', type: 'password', autocomplete: 'off' }, 'Write-only: never shown again. Leave empty to keep the current one.'),
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Save backend'), h('button', { type: 'reset', class: 'link' }, 'Clear')),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = formData(form);
    const body = { name: f.name, kind: f.kind, address: f.address };
    if (f.credential !== '') body.credential = f.credential;
    const ok = await attempt(() => (f.backend_id ? api('PATCH', `${NS(ns)}/backends/${f.backend_id}`, body) : api('POST', `${NS(ns)}/backends`, body)));
    if (ok) {
      flash(`Backend ${f.name} saved.`);
      route();
    }
  });
  // Clear after an edit starts a new backend: a reset alone keeps a hidden field's value.
  form.addEventListener('reset', () => (form.elements.backend_id.value = ''));
  const edit = (b) => {
    for (const k of ['backend_id', 'name', 'kind', 'address']) form.elements[k].value = b[k];
    form.elements.credential.value = '';
    form.elements.name.focus();
  };
  return h(
    'section',
    { 'aria-labelledby': 'h-backends' },
    h('h2', { id: 'h-backends' }, 'Backends'),
    table('Backends', [
      ['Name', (b) => b.name],
      ['Kind', (b) => b.kind],
      ['Address', (b) => h('code', {}, b.address)],
      ['Credential', (b) => (b.credential_source === 'caller' ? 'the caller’s' : b.has_credential ? h('span', { class: 'pill ok' }, 'set') : h('span', { class: 'pill' }, 'not set'))],
      ['', (b) => canWrite() ? h('span', { class: 'actions' },
        h('button', { class: 'link', 'aria-label': `Edit backend ${b.name}`, onclick: () => edit(b) }, 'Edit'),
        h('button', { class: 'danger', 'aria-label': `Delete backend ${b.name}`, onclick: async () => {
          if (await attempt(() => api('DELETE', `${NS(ns)}/backends/${b.backend_id}`))) route();
        } }, 'Delete')) : null],
    ], backends, 'No backends yet.'),
    canWrite() ? form : null,
  );
}

function ruleSection(ns, rules, backends, backendName) {
  const form = h(
    'form',
    { class: 'card grid', 'aria-label': 'Add or edit a routing rule' },
    h('input', { type: 'hidden', name: 'rule_id' }),
    field('Model or pattern', { name: 'model', required: true, placeholder: 'gpt-*' }),
    field('Action', { name: 'action', options: [['route', 'Route to a backend'], ['decline', 'Decline']] }),
    field('Backend', { name: 'backend_id', options: [['', '—'], ...backends.map((b) => [b.backend_id, b.name])] }),
    field('Rewrite model to', { name: 'rewrite_model' }, 'Optional.'),
    field('Priority', { name: 'priority', type: 'number', value: '0' }),
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Save rule'), h('button', { type: 'reset', class: 'link' }, 'Clear')),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = formData(form);
    const body = { model: f.model, action: f.action, priority: Number(f.priority || 0), rewrite_model: f.rewrite_model || null };
    body.backend_id = f.action === 'decline' ? null : f.backend_id || null;
    const ok = await attempt(() => (f.rule_id ? api('PATCH', `${NS(ns)}/routing-rules/${f.rule_id}`, body) : api('POST', `${NS(ns)}/routing-rules`, body)));
    if (ok) {
      flash(`Rule ${f.model} saved.`);
      route();
    }
  });
  form.addEventListener('reset', () => (form.elements.rule_id.value = ''));
  const edit = (r) => {
    for (const k of ['rule_id', 'model', 'action', 'priority']) form.elements[k].value = String(r[k]);
    form.elements.backend_id.value = r.backend_id ?? '';
    form.elements.rewrite_model.value = r.rewrite_model ?? '';
    form.elements.model.focus();
  };

  const answer = h('p', { class: 'answer', role: 'status' });
  const which = h('form', { class: 'card inline', 'aria-label': 'Which rule takes a model' },
    field('Which rule takes model', { name: 'model', required: true, placeholder: 'gpt-4o-mini' }),
    h('button', { type: 'submit' }, 'Find rule'), answer);
  which.addEventListener('submit', async (e) => {
    e.preventDefault();
    const model = formData(which).model;
    await attempt(async () => {
      const { rule } = await api('GET', `${NS(ns)}/route?model=${encodeURIComponent(model)}`);
      if (!rule) answer.textContent = `No rule matches ${model}: calls for it are refused.`;
      else if (rule.action === 'decline') answer.textContent = `Rule ${rule.model} takes ${model} and declines it.`;
      else answer.textContent = `Rule ${rule.model} takes ${model} → backend ${backendName.get(rule.backend_id) ?? '—'}${rule.rewrite_model ? `, as model ${rule.rewrite_model}` : ''}.`;
    });
  });

  return h(
    'section',
    { 'aria-labelledby': 'h-rules' },
    h('h2', { id: 'h-rules' }, 'Routing rules'),
    table('Routing rules', [
      ['Model', (r) => h('code', {}, r.model)],
      ['Goes to', (r) => (r.action === 'decline' ? h('span', { class: 'pill warn' }, 'declined') : backendName.get(r.backend_id) ?? '—')],
      ['Rewrite', (r) => r.rewrite_model ?? '—'],
      ['Priority', (r) => String(r.priority)],
      ['', (r) => canWrite() ? h('span', { class: 'actions' },
        h('button', { class: 'link', 'aria-label': `Edit rule ${r.model}`, onclick: () => edit(r) }, 'Edit'),
        h('button', { class: 'danger', 'aria-label': `Delete rule ${r.model}`, onclick: async () => {
          if (await attempt(() => api('DELETE', `${NS(ns)}/routing-rules/${r.rule_id}`))) route();
        } }, 'Delete')) : null],
    ], rules, 'No rules yet: without one, no model is routed.'),
    which,
    canWrite() ? form : null,
  );
}

function keySection(ns, keys) {
  const shown = h('div', { class: 'once', hidden: true });
  const form = h(
    'form',
    { class: 'card inline', 'aria-label': 'Create API key' },
    field('Key name', { name: 'name', required: true, placeholder: 'ci' }),
    h('fieldset', {}, h('legend', {}, 'Grants'),
      h('label', {}, h('input', { type: 'checkbox', name: 'use', checked: true, disabled: true }), ' use (call models)'),
      h('label', {}, h('input', { type: 'checkbox', name: 'manage' }), ' manage (list requests, usage)')),
    ...limitFields(),
    h('button', { type: 'submit', class: 'primary' }, 'Create key'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const grants = form.elements.manage.checked ? ['use', 'manage'] : ['use'];
    await attempt(async () => {
      const created = await api('POST', `${NS(ns)}/api-keys`, { name: form.elements.name.value, grants, limits: limitsOf(formData(form)) });
      const out = h('output', { 'aria-label': 'New API key', class: 'secret' }, created.key);
      shown.replaceChildren(
        h('p', {}, h('strong', {}, 'Copy this key now: '), 'it is shown this once and cannot be read again.'),
        out,
        h('button', { onclick: async () => {
          await navigator.clipboard?.writeText(created.key).catch(() => {});
          flash('Key copied.');
        } }, 'Copy key'),
      );
      shown.hidden = false;
      form.reset();
      const list = await api('GET', `${NS(ns)}/api-keys`);
      section.querySelector('.keys').replaceChildren(keyTable(ns, list.data));
      limits.replaceWith((limits = limitsForm(ns, list.data)));
    });
  });
  let limits = limitsForm(ns, keys);
  const section = h(
    'section',
    { 'aria-labelledby': 'h-keys' },
    h('h2', { id: 'h-keys' }, 'API keys'),
    h('div', { class: 'keys' }, keyTable(ns, keys)),
    shown,
    canWrite() ? form : null,
    canWrite() ? limits : null,
  );
  return section;
}

/** Changes a live key's limits in place (its secret stays the same). */
function limitsForm(ns, keys) {
  const live = keys.filter((k) => !k.revoked_at);
  const form = h(
    'form',
    { class: 'card inline', 'aria-label': 'Change a key\'s limits', hidden: live.length === 0 },
    field('Key', { name: 'api_key_id', options: live.map((k) => [k.api_key_id, `${k.name} (${k.prefix})`]) }),
    ...limitFields(),
    h('button', { type: 'submit' }, 'Save limits'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = formData(form);
    let changed;
    if (await attempt(async () => (changed = await api('PATCH', `${NS(ns)}/api-keys/${f.api_key_id}`, { limits: limitsOf(f) })))) {
      flash(`Limits of key ${changed.name}: ${limitWords(changed.limits)}.`);
      route();
    }
  });
  return form;
}

function keyTable(ns, keys) {
  return table('API keys', [
    ['Name', (k) => k.name],
    ['Prefix', (k) => h('code', {}, k.prefix)],
    ['Grants', (k) => k.grants.join(', ')],
    ['Limits', (k) => limitWords(k.limits)],
    ['Last used', (k) => fmt.time(k.last_used_at)],
    ['State', (k) => (k.revoked_at ? h('span', { class: 'pill bad' }, `revoked ${fmt.time(k.revoked_at)}`) : h('span', { class: 'pill ok' }, 'live'))],
    ['', (k) => (canWrite() && !k.revoked_at ? h('button', { class: 'danger', 'aria-label': `Revoke key ${k.name}`, onclick: async () => {
      if (confirm(`Revoke key ${k.name}? Callers using it get 401 at once.`) && (await attempt(() => api('DELETE', `${NS(ns)}/api-keys/${k.api_key_id}`)))) {
        flash(`Key ${k.name} revoked.`);
        route();
      }
    } }, 'Revoke') : null)],
  ], keys, 'No keys yet.');
}
