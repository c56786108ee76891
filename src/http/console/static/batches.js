// A namespace's batches (docs/console.md "Batches"): both vendors' batches, newest first, each
// with a progress bar of its lines by state; a batch's page lists its lines, each linking to the
// request it became.
import { h, api, fmt, pagedTable } from './lib.js';
import { page, NS, flash } from './app.js';

const nsLink = (ns, rest = '') => `#/ns/${encodeURIComponent(ns)}${rest}`;
// The order states are drawn in the bar, ended first.
const STATES = ['succeeded', 'failed', 'refused', 'canceled', 'expired', 'running', 'waiting'];

/** A stacked bar of a batch's lines by state, with the share that ended. */
function progress(b) {
  const total = Math.max(1, b.total);
  const ended = STATES.slice(0, 5).reduce((n, s) => n + (b.counts[s] ?? 0), 0);
  return h('span', { class: 'progress', title: STATES.filter((s) => b.counts[s]).map((s) => `${s} ${b.counts[s]}`).join(' · ') },
    h('span', { class: 'track', role: 'progressbar', 'aria-valuemin': '0', 'aria-valuemax': String(b.total), 'aria-valuenow': String(ended), 'aria-label': `${ended} of ${b.total} lines ended` },
      STATES.map((s) => (b.counts[s] ? h('span', { class: `seg ${s}`, style: `--w: ${((b.counts[s] / total) * 100).toFixed(2)}%` }) : null))),
    ` ${fmt.int(ended)} / ${fmt.int(b.total)}`);
}

const vendorWords = (b) => (b.vendor === 'openai' ? `OpenAI ${b.endpoint}` : 'Anthropic message batch');

export async function batchesPage(ns) {
  const [body, more] = await pagedTable('Batches', [
    ['Batch', (b) => h('a', { href: nsLink(ns, `/batches/${b.id}`) }, h('code', {}, b.id))],
    ['Kind', vendorWords],
    ['Status', (b) => h('span', { class: `pill ${b.status}` }, b.status)],
    ['Progress', progress],
    ['Created', (b) => fmt.time(b.created_at)],
    ['Ended', (b) => fmt.time(b.ended_at)],
  ], (after) => api('GET', `${NS(ns)}/batches?limit=50${after ? `&after=${encodeURIComponent(after)}` : ''}`), {
    empty: 'No batches yet. Start one with the OpenAI Batches or Anthropic Message Batches API.',
    more: 'Older batches',
    onError: (e) => flash(e.message, 'error'),
  });
  page(`Batches in ${ns}`, h('p', { class: 'subnav' }, h('a', { href: nsLink(ns) }, `← ${ns}`), h('a', { href: nsLink(ns, '/requests') }, 'Requests')), body, more);
}

export async function batchPage(ns, id) {
  let batch = null;
  const [body, more] = await pagedTable('Lines', [
    ['Line', (l) => fmt.int(l.line)],
    ['custom_id', (l) => h('code', {}, l.custom_id)],
    ['State', (l) => h('span', { class: `pill ${l.state}` }, l.state)],
    ['Request', (l) => (l.request_id ? h('a', { href: nsLink(ns, `/requests/${l.request_id}`) }, h('code', {}, l.request_id)) : '—')],
    ['Error', (l) => (l.error_code ? `${l.error_status ?? ''} ${l.error_code}` : '')],
  ], async (after) => {
    const res = await api('GET', `${NS(ns)}/batches/${encodeURIComponent(id)}/lines?limit=200${after ? `&after=${after}` : ''}`);
    batch = res.batch;
    return res;
  }, { empty: 'No lines: the batch failed validation.', more: 'More lines', onError: (e) => flash(e.message, 'error') });
  page(`Batch ${id}`,
    h('p', { class: 'subnav' }, h('a', { href: nsLink(ns, '/batches') }, '← Batches')),
    h('dl', { class: 'facts' },
      h('dt', {}, 'Kind'), h('dd', {}, vendorWords(batch)),
      h('dt', {}, 'Status'), h('dd', {}, batch.status),
      h('dt', {}, 'Progress'), h('dd', {}, progress(batch)),
      h('dt', {}, 'Created'), h('dd', {}, fmt.time(batch.created_at)),
      h('dt', {}, 'Ended'), h('dd', {}, fmt.time(batch.ended_at))),
    body, more);
}
