// The console shell: the session, the hash router, sign-in and the password change, and the
// namespace pages. Every read and write goes through the documented routes.
import { h, api, whenSignedOut, formData, fmt, field, table } from './lib.js';
import { requestsPage, requestPage, usagePage } from './requests.js';
import { billingPage, usersPage } from './tenancy.js';
import { namespacePage } from './namespace.js';
import { batchesPage, batchPage } from './batches.js';

const app = document.getElementById('app');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const flashBox = document.getElementById('flash');

export const session = { tenancy: localStorage.getItem('sarsen.tenancy') ?? '', me: null };
export const T = () => `/${encodeURIComponent(session.tenancy)}/v1`;
export const NS = (ns) => `${T()}/namespaces/${encodeURIComponent(ns)}`;
export const canWrite = () => session.me && session.me.role !== 'viewer';
export const isOwner = () => session.me?.role === 'owner';

let keepFlash = false; // a message survives the next page render, not the one after

export function flash(message, kind = 'ok') {
  keepFlash = true;
  flashBox.replaceChildren(h('p', { class: `flash ${kind}` }, message));
  if (kind === 'ok') setTimeout(() => flashBox.replaceChildren(), 6000);
}

/** Runs `fn`, showing the server's message when it fails; answers whether it succeeded. */
export async function attempt(fn) {
  try {
    await fn();
    return true;
  } catch (err) {
    flash(err.message, 'error');
    return false;
  }
}

whenSignedOut(() => {
  session.me = null;
  flash('Your session has ended. Sign in again.', 'error');
  location.hash = '#/sign-in';
});

function page(title, ...children) {
  document.title = `${title} · Sarsen`;
  app.replaceChildren(h('h1', {}, title), ...children);
  app.focus();
}
export { page };

function renderChrome() {
  if (!session.me) {
    nav.hidden = true;
    who.replaceChildren();
    return;
  }
  nav.hidden = false;
  const links = [['#/namespaces', 'Namespaces']];
  if (isOwner()) links.push(['#/users', 'Users'], ['#/billing', 'Billing']);
  nav.replaceChildren(...links.map(([href, text]) => h('a', { href, 'aria-current': location.hash.startsWith(href) ? 'page' : null }, text)));
  who.replaceChildren(
    h('span', {}, `${session.me.email} · ${session.tenancy} · `, h('span', { class: `role ${session.me.role}` }, session.me.role)),
    h('button', { class: 'link', onclick: signOut }, 'Sign out'),
  );
}

async function signOut() {
  await api('DELETE', `${T()}/sessions/current`).catch(() => {});
  session.me = null;
  location.hash = '#/sign-in';
}

function signInPage() {
  const form = h(
    'form',
    { class: 'card narrow', 'aria-label': 'Sign in' },
    field('Tenancy', { name: 'tenancy', required: true, value: session.tenancy, autocomplete: 'organization' }),
    field('Email', { name: 'email', type: 'email', required: true, autocomplete: 'username' }),
    field('Password', { name: 'password', type: 'password', required: true, autocomplete: 'current-password' }),
    h('button', { type: 'submit', class: 'primary' }, 'Sign in'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const { tenancy, email, password } = formData(form);
    await attempt(async () => {
      const me = await api('POST', `/${encodeURIComponent(tenancy)}/v1/sessions/cookie`, { email, password });
      session.tenancy = tenancy;
      localStorage.setItem('sarsen.tenancy', tenancy);
      session.me = me;
      flashBox.replaceChildren();
      location.hash = me.password_change_required ? '#/password' : '#/namespaces';
    });
  });
  page('Sign in to Sarsen', h('p', { class: 'muted' }, 'Use the console account your tenancy owner gave you.'), form);
}

function passwordPage() {
  const forced = session.me?.password_change_required;
  const form = h(
    'form',
    { class: 'card narrow', 'aria-label': 'Change password' },
    field('Current password', { name: 'current_password', type: 'password', required: true, autocomplete: 'current-password' }),
    field('New password', { name: 'new_password', type: 'password', required: true, minlength: 12, autocomplete: 'new-password' }, 'At least 12 characters.'),
    h('button', { type: 'submit', class: 'primary' }, 'Change password'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (await attempt(() => api('POST', `${T()}/account/password`, formData(form)))) {
      session.me.password_change_required = false;
      flash('Password changed.');
      location.hash = '#/namespaces';
    }
  });
  page(
    'Choose your password',
    forced ? h('p', { class: 'notice' }, 'This account still has the password it was given. Choose your own before going on.') : null,
    form,
  );
}

function retentionWords(n) {
  const horizon = fmt.minutes(n.effective_retention_minutes);
  if (n.retention_minutes === null) return `Tenancy default → kept ${horizon}`;
  if (n.retention_minutes === 0) return `0 (keep as long as the metadata) → kept ${horizon}`;
  if (n.retention_minutes > n.effective_retention_minutes) return `${fmt.minutes(n.retention_minutes)}, clamped to the metadata horizon → kept ${horizon}`;
  return `Kept ${horizon}`;
}

async function namespacesPage() {
  const { data } = await api('GET', `${T()}/namespaces`);
  const create = h(
    'form',
    { class: 'card inline', 'aria-label': 'Create namespace' },
    field('Name', { name: 'name', required: true, placeholder: 'production' }),
    field('Retention (minutes)', { name: 'retention_minutes', type: 'number', min: 0 }, 'Empty: the tenancy default. 0: as long as the deployment keeps metadata. Larger values are clamped to that horizon.'),
    h('button', { type: 'submit', class: 'primary' }, 'Create namespace'),
  );
  create.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = formData(create);
    const body = { name: f.name };
    if (f.retention_minutes !== '') body.retention_minutes = Number(f.retention_minutes);
    if (await attempt(() => api('POST', `${T()}/namespaces`, body))) route();
  });
  page(
    'Namespaces',
    table('Namespaces', [
      ['Name', (n) => h('a', { href: `#/ns/${encodeURIComponent(n.name)}` }, n.name)],
      ['Retention', (n) => retentionWords(n)],
      ['Created', (n) => fmt.time(n.created_at)],
      ['', (n) => h('span', { class: 'actions' },
        h('a', { href: `#/ns/${encodeURIComponent(n.name)}/requests` }, 'Requests'),
        h('a', { href: `#/ns/${encodeURIComponent(n.name)}/usage` }, 'Usage'),
        canWrite() ? h('button', { class: 'danger', 'aria-label': `Delete namespace ${n.name}`, onclick: async () => {
          if (confirm(`Delete namespace ${n.name} with its backends, rules and keys?`) && (await attempt(() => api('DELETE', NS(n.name))))) route();
        } }, 'Delete') : null)],
    ], data, 'No namespaces yet: create one below.'),
    canWrite() ? create : null,
  );
}

const ROUTES = [
  [/^#\/sign-in$/, signInPage, false],
  [/^#\/password$/, passwordPage, false],
  [/^#\/namespaces$/, namespacesPage, true],
  [/^#\/ns\/([^/]+)$/, (ns) => namespacePage(decodeURIComponent(ns)), true],
  [/^#\/ns\/([^/]+)\/requests(?:\?(.*))?$/, (ns, query) => requestsPage(decodeURIComponent(ns), query), true],
  [/^#\/ns\/([^/]+)\/requests\/([^/]+)$/, (ns, id) => requestPage(decodeURIComponent(ns), decodeURIComponent(id)), true],
  [/^#\/ns\/([^/]+)\/usage$/, (ns) => usagePage(decodeURIComponent(ns)), true],
  [/^#\/ns\/([^/]+)\/batches$/, (ns) => batchesPage(decodeURIComponent(ns)), true],
  [/^#\/ns\/([^/]+)\/batches\/([^/]+)$/, (ns, id) => batchPage(decodeURIComponent(ns), decodeURIComponent(id)), true],
  [/^#\/users$/, () => usersPage(), true],
  [/^#\/billing$/, () => billingPage(), true],
];

export async function route() {
  if (!session.me && session.tenancy) {
    try {
      session.me = await api('GET', `${T()}/sessions/current`);
    } catch {
      session.me = null;
    }
  }
  if (!keepFlash) flashBox.replaceChildren();
  keepFlash = false;
  const hash = location.hash || '#/namespaces';
  const [re, render, needsSession] = ROUTES.find(([r]) => r.test(hash)) ?? [/^/, namespacesPage, true];
  if (needsSession && !session.me) return void (location.hash = '#/sign-in');
  if (needsSession && session.me.password_change_required) return void (location.hash = '#/password');
  renderChrome();
  try {
    await render(...hash.match(re).slice(1));
  } catch (err) {
    if (err.status !== 401) page('Something went wrong', h('p', { class: 'notice error' }, err.message));
  }
}

window.addEventListener('hashchange', route);
route();
