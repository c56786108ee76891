// Owner pages: billing (balance, metering, the ledger with paging) and console users.
import { h, api, formData, fmt, field, table, pagedTable } from './lib.js';
import { page, T, attempt, flash, route, session } from './app.js';

export async function billingPage() {
  const billing = await api('GET', `${T()}/billing`);
  const [body, more] = await pagedTable('Ledger', [
    ['When', (e) => fmt.time(e.created_at)],
    ['Kind', (e) => e.kind],
    ['Amount', (e) => fmt.credits(e.amount_micros)],
    ['Request', (e) => (e.request_id ? h('code', {}, e.request_id) : '—')],
  ], (after) => api('GET', `${T()}/billing/ledger?limit=50${after ? `&after=${encodeURIComponent(after)}` : ''}`),
  { empty: 'No ledger entries yet.', more: 'Older entries', onError: (e) => flash(e.message, 'error') });
  page(
    'Billing',
    h('section', { class: 'stats' },
      h('div', { class: 'stat card' }, h('span', { class: 'value' }, fmt.credits(billing.balance_micros)), h('span', { class: 'name' }, 'Balance')),
      h('div', { class: 'stat card' }, h('span', { class: 'value' }, billing.metering_enabled ? 'on' : 'off'), h('span', { class: 'name' }, 'Metering'))),
    h('h2', {}, 'Ledger'),
    body,
    more,
  );
}

const ROLES = [['viewer', 'viewer (reads)'], ['admin', 'admin (configures)'], ['owner', 'owner (everything)']];

export async function usersPage() {
  const { data } = await api('GET', `${T()}/users`);
  const shown = h('div', { class: 'once', hidden: true });
  const form = h('form', { class: 'card inline', 'aria-label': 'Add user' },
    field('Email', { name: 'email', type: 'email', required: true }),
    field('Role', { name: 'role', options: ROLES, value: 'viewer' }),
    h('button', { type: 'submit', class: 'primary' }, 'Add user'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    await attempt(async () => {
      const created = await api('POST', `${T()}/users`, formData(form));
      await usersPage();
      const again = document.querySelector('.once');
      again.replaceChildren(h('p', {}, h('strong', {}, `Password for ${created.email}: `), 'shown this once; they choose their own at first sign-in.'),
        h('output', { class: 'secret', 'aria-label': 'Generated password' }, created.password));
      again.hidden = false;
    });
  });
  page(
    'Users',
    table('Users', [
      ['Email', (u) => u.email],
      ['Role', (u) => (u.user_id === session.me.user_id ? u.role : roleSelect(u))],
      ['Password', (u) => (u.password_chosen ? 'chosen' : h('span', { class: 'pill warn' }, 'generated'))],
      ['Created', (u) => fmt.time(u.created_at)],
      ['', (u) => (u.user_id === session.me.user_id ? h('span', { class: 'muted' }, 'you') : h('button', { class: 'danger', 'aria-label': `Remove user ${u.email}`, onclick: async () => {
        if (confirm(`Remove ${u.email}?`) && (await attempt(() => api('DELETE', `${T()}/users/${u.user_id}`)))) route();
      } }, 'Remove'))],
    ], data),
    shown,
    form,
  );
}

function roleSelect(u) {
  const select = h('select', { 'aria-label': `Role of ${u.email}` }, ROLES.map(([v, text]) => h('option', { value: v, selected: v === u.role }, text)));
  select.addEventListener('change', async () => {
    if (await attempt(() => api('PATCH', `${T()}/users/${u.user_id}`, { role: select.value }))) flash(`${u.email} is now ${select.value}.`);
  });
  return select;
}
