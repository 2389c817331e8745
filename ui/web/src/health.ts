// The Health page: exporters and their element sets, record rates, drops
// by reason and the sinks, read off the aggregator's metrics.

import { getJSON, type Health } from './api'
import { h, num, type Page } from './util'

function table(caption: string, head: string[], rows: (string | Node)[][], numeric: number[] = []): HTMLTableElement {
  return h('table', {},
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, ...head.map((t, i) => h('th', { scope: 'col', class: numeric.includes(i) ? 'num' : '' }, t)))),
    h('tbody', {}, ...(rows.length ? rows : [[h('em', {}, 'none')]]).map((r) =>
      h('tr', {}, ...r.map((c, i) => h('td', { class: numeric.includes(i) ? 'num' : '', colspan: r.length === 1 ? head.length : undefined }, c))))))
}

export const healthPage: Page = (root) => {
  const body = h('div', { class: 'health', 'aria-live': 'off' })
  const status = h('p', { class: 'status', id: 'health-status' }, 'Loading…')
  root.append(h('div', { class: 'page-head' }, h('h1', { tabindex: -1 }, 'Health')), status, body)
  const ac = new AbortController()
  async function load() {
    try {
      const hl = await getJSON<Health>('api/health', ac.signal)
      const sessions = Object.entries(hl.sessions).map(([t, n]) => t + ' ' + num(n)).join(', ') || 'none'
      const kpis = h('ul', { class: 'kpis' },
        h('li', {}, h('span', { class: 'k' }, 'Records in'), h('span', { class: 'v', id: 'kpi-in' }, num(hl.in, 1) + '/s')),
        h('li', {}, h('span', { class: 'k' }, 'Records out (all sinks)'), h('span', { class: 'v', id: 'kpi-out' }, num(hl.out, 1) + '/s')),
        h('li', {}, h('span', { class: 'k' }, 'Open sessions'), h('span', { class: 'v' }, sessions)),
        h('li', {}, h('span', { class: 'k' }, 'Mode'), h('span', { class: 'v' }, hl.mode)))
      const exporters = table('Exporters (by source address; active: records in the last 10 s)',
        ['Address', 'Transport', 'Active', 'Records', 'Records/s', 'Unknown elements', 'Missing elements', 'Element set'],
        hl.exporters.map((e) => [e.address, e.transport, e.active ? 'yes' : 'no', num(e.records), num(e.rate, 1), num(e.unknown), num(e.missing), e.profile]),
        [3, 4, 5, 6])
      exporters.id = 'exporters'
      const sinks = table('Sinks', ['Sink', 'Connected', 'Exported', 'Exported/s', 'Dropped'],
        hl.sinks.map((s) => [s.name, s.connected ? 'yes' : 'no', num(s.exported), num(s.rate, 1), num(s.dropped)]), [2, 3, 4])
      sinks.id = 'sinks'
      const drops = table('Drops by reason', ['Series', 'Labels', 'Total', 'Per second'],
        hl.drops.map((d) => [d.series.replace(/^sluice_/, ''), Object.entries(d.labels).map(([k, v]) => k + '=' + v).join(' '), num(d.total), num(d.rate, 1)]), [2, 3])
      drops.id = 'drops'
      const wrap = (t: HTMLElement) => h('div', { class: 'tscroll' }, t)
      body.replaceChildren(kpis, wrap(exporters), wrap(sinks), wrap(drops))
      status.textContent = 'Updated ' + new Date(hl.at).toISOString().slice(11, 19) + ' UTC · the web UI read ' + num(hl.ui.seen) + ' records, missed or sampled out ' + num(hl.ui.dropped)
    } catch (e) {
      if (!ac.signal.aborted) status.textContent = 'Cannot read the health figures: ' + (e as Error).message
    }
  }
  load()
  const timer = setInterval(load, 2000)
  return () => {
    ac.abort()
    clearInterval(timer)
  }
}
