// The Flows page: a live, virtualised table of the records the aggregator
// hands to its sinks, with filters, sorting, pause and a row's every field.

import { Virtualizer, elementScroll, observeElementOffset, observeElementRect } from '@tanstack/virtual-core'
import type { FlowEvent, Row } from './api'
import { bits, bytes, h, num, podName, time, type Page } from './util'

// The most records the page keeps; older ones leave first.
const MAX_ROWS = 10000
const ROW_HEIGHT = 30

interface Column {
  key: string
  title: string
  width: number
  text: (r: Row) => string
  sort: (r: Row) => string | number
  cls?: string
}

const columns: Column[] = [
  { key: 't', title: 'Time', width: 80, text: (r) => time(r.t), sort: (r) => r.t },
  { key: 'src', title: 'Source', width: 190, text: (r) => podName(r.srcNs, r.srcPod) || r.srcIp, sort: (r) => podName(r.srcNs, r.srcPod) || r.srcIp },
  { key: 'srcNode', title: 'Source Node', width: 110, text: (r) => r.srcNode ?? '', sort: (r) => r.srcNode ?? '' },
  { key: 'dst', title: 'Destination', width: 190, text: (r) => podName(r.dstNs, r.dstPod) || r.dstIp, sort: (r) => podName(r.dstNs, r.dstPod) || r.dstIp },
  { key: 'dstNode', title: 'Destination Node', width: 110, text: (r) => r.dstNode ?? '', sort: (r) => r.dstNode ?? '' },
  { key: 'svc', title: 'Service', width: 150, text: (r) => r.svc ?? '', sort: (r) => r.svc ?? '' },
  { key: 'proto', title: 'Protocol', width: 70, text: (r) => r.proto, sort: (r) => r.proto },
  { key: 'port', title: 'Port', width: 60, text: (r) => String(r.dstPort), sort: (r) => r.dstPort, cls: 'num' },
  { key: 'bytes', title: 'Bytes', width: 90, text: (r) => bytes(r.bytes), sort: (r) => r.bytes, cls: 'num' },
  { key: 'bps', title: 'Throughput', width: 100, text: (r) => bits(r.bps), sort: (r) => r.bps, cls: 'num' },
  { key: 'policy', title: 'Policy rule', width: 200, text: (r) => r.policy ?? '', sort: (r) => r.policy ?? '' },
  { key: 'action', title: 'Action', width: 70, text: (r) => r.action ?? '', sort: (r) => r.action ?? '' },
  { key: 'egress', title: 'Egress', width: 170, text: (r) => (r.egress ? r.egress + (r.egressIp ? ' (' + r.egressIp + ')' : '') : ''), sort: (r) => r.egress ?? '' },
]
const tableWidth = columns.reduce((s, c) => s + c.width, 0)

// Endpoint keys of a row at each grouping, as the map names its nodes.
function srcKeys(r: Row): string[] {
  return r.srcPod ? ['ns:' + r.srcNs, 'wl:' + r.srcNs + '/' + r.srcWl, 'pod:' + r.srcNs + '/' + r.srcPod] : ['ip:' + r.srcIp]
}
function dstKeys(r: Row): string[] {
  return r.dstPod ? ['ns:' + r.dstNs, 'wl:' + r.dstNs + '/' + r.dstWl, 'pod:' + r.dstNs + '/' + r.dstPod] : ['ip:' + r.dstIp]
}
function egressKey(r: Row): string {
  return r.egress || r.egressIp ? 'egress:' + (r.egress ?? '') + '/' + (r.egressIp ?? '') : ''
}

interface Filters {
  ns: string
  pod: string
  svc: string
  node: string
  policy: string
  action: string
  proto: string
  since: string
  from: string
  to: string
}
const filterKeys: (keyof Filters)[] = ['ns', 'pod', 'svc', 'node', 'policy', 'action', 'proto', 'since', 'from', 'to']

function matcher(f: Filters): (r: Row) => boolean {
  const lc = (s: string) => s.trim().toLowerCase()
  const ns = lc(f.ns), pod = lc(f.pod), svc = lc(f.svc), node = lc(f.node), policy = lc(f.policy)
  const since = f.since ? Date.now() - Number(f.since) * 1000 : 0
  return (r) => {
    if (ns && !(r.srcNs?.toLowerCase() === ns || r.dstNs?.toLowerCase() === ns)) return false
    if (pod && !(podName(r.srcNs, r.srcPod).toLowerCase().includes(pod) || podName(r.dstNs, r.dstPod).toLowerCase().includes(pod))) return false
    if (svc && !(r.svc ?? '').toLowerCase().includes(svc)) return false
    if (node && !((r.srcNode ?? '').toLowerCase().includes(node) || (r.dstNode ?? '').toLowerCase().includes(node) || (r.egressNode ?? '').toLowerCase().includes(node))) return false
    if (policy && !(r.policy ?? '').toLowerCase().includes(policy)) return false
    if (f.action && (r.action ?? 'None') !== f.action) return false
    if (f.proto && r.proto !== f.proto) return false
    if (since && r.t < since) return false
    if (f.from && !(srcKeys(r).includes(f.from) || egressKey(r) === f.from)) return false
    if (f.to && !(dstKeys(r).includes(f.to) || egressKey(r) === f.to)) return false
    return true
  }
}

// The fields the details panel shows before the server's full record
// arrives (and if it no longer holds it).
const rowFields: [string, (r: Row) => string | number | undefined][] = [
  ['Source Pod', (r) => podName(r.srcNs, r.srcPod)], ['Source IP', (r) => r.srcIp], ['Source port', (r) => r.srcPort],
  ['Source Node', (r) => r.srcNode], ['Destination Pod', (r) => podName(r.dstNs, r.dstPod)], ['Destination IP', (r) => r.dstIp],
  ['Destination port', (r) => r.dstPort], ['Destination Node', (r) => r.dstNode], ['Service', (r) => r.svc], ['Protocol', (r) => r.proto],
  ['Bytes (both directions)', (r) => r.bytes], ['Throughput', (r) => bits(r.bps)], ['Policy rule', (r) => r.policy], ['Action', (r) => r.action],
  ['Egress', (r) => r.egress], ['Egress IP', (r) => r.egressIp], ['Egress Node', (r) => r.egressNode], ['Flow type', (r) => r.type],
  ['Start', (r) => (r.start ? new Date(r.start).toISOString() : '')], ['End', (r) => (r.t ? new Date(r.t).toISOString() : '')],
]

export const flowsPage: Page = (root, params) => {
  const filters: Filters = { ns: '', pod: '', svc: '', node: '', policy: '', action: '', proto: '', since: '', from: '', to: '' }
  for (const k of filterKeys) filters[k] = params.get(k) ?? ''
  let sortKey = 't'
  let sortDesc = true
  let all: Row[] = []
  let pending: Row[] = []
  let view: Row[] = []
  let paused = false
  let dirty = true
  let focusSeq = -1
  // Rates over the last second: records received, left out by the
  // sample, lost.
  const win = { got: 0, skipped: 0, lost: 0, since: performance.now() }
  let shown = { got: 0, skipped: 0, lost: 0 }
  let tapLost = 0

  const input = (key: keyof Filters, label: string, placeholder: string) =>
    h('label', { class: 'field' }, label, h('input', { type: 'search', name: key, value: filters[key], placeholder, autocomplete: 'off' }))
  const select = (key: keyof Filters, label: string, options: [string, string][]) => {
    const s = h('select', { name: key }, ...options.map(([v, t]) => h('option', { value: v, selected: v === filters[key] }, t)))
    return h('label', { class: 'field' }, label, s)
  }
  const form = h('form', { class: 'filters', 'aria-label': 'Filters', role: 'search' },
    input('ns', 'Namespace', 'exact, either end'),
    input('pod', 'Pod', 'either end'),
    input('svc', 'Service', 'ns/name:port'),
    input('node', 'Node', 'any Node'),
    input('policy', 'Policy', 'name or rule'),
    select('action', 'Action', [['', 'any'], ['Allow', 'Allow'], ['Drop', 'Drop'], ['Reject', 'Reject'], ['None', 'none']]),
    select('proto', 'Protocol', [['', 'any'], ['TCP', 'TCP'], ['UDP', 'UDP'], ['ICMP', 'ICMP'], ['SCTP', 'SCTP']]),
    select('since', 'Time', [['', 'all kept'], ['60', 'last minute'], ['300', 'last 5 minutes'], ['900', 'last 15 minutes']]),
  )
  const edgeNote = h('p', { class: 'edge-filter', hidden: !(filters.from || filters.to) },
    'Only the map edge ', h('strong', {}, (filters.from || 'anything') + ' → ' + (filters.to || 'anything')), ' ',
    h('button', { type: 'button', class: 'link', onclick: () => { filters.from = filters.to = ''; edgeNote.hidden = true; writeHash(); dirty = true } }, 'Show all edges'))
  const pauseBtn = h('button', { type: 'button', 'aria-pressed': 'false', class: 'pause' }, 'Pause')
  const status = h('p', { class: 'status', id: 'flow-status' }, 'Connecting…')
  const sampling = h('p', { class: 'sampling', role: 'status', 'aria-live': 'polite' })
  const count = h('span', { id: 'flow-count' }, '0')

  const header = h('div', { role: 'row', class: 'tr thead-row' }, ...columns.map((c) =>
    h('div', { role: 'columnheader', class: 'th ' + (c.cls ?? ''), style: `width:${c.width}px`, 'data-key': c.key, 'aria-sort': c.key === sortKey ? (sortDesc ? 'descending' : 'ascending') : 'none' },
      h('button', { type: 'button', 'data-key': c.key, title: 'Sort by ' + c.title }, c.title))))
  const spacer = h('div', { class: 'spacer', role: 'presentation' })
  const body = h('div', { class: 'tbody', role: 'rowgroup', 'aria-label': 'Records, newest first unless sorted' }, spacer)
  const table = h('div', { class: 'table', role: 'table', 'aria-label': 'Flow records', 'aria-rowcount': 0, style: `width:${tableWidth}px` },
    h('div', { role: 'rowgroup', class: 'thead' }, header), body)
  const scroller = h('div', { class: 'hscroll' }, table)
  const details = h('aside', { class: 'details', role: 'dialog', 'aria-labelledby': 'details-title', hidden: true })

  root.append(
    h('div', { class: 'page-head' }, h('h1', { tabindex: -1 }, 'Flows'), pauseBtn,
      h('span', { class: 'counts' }, count, ' shown')),
    form, edgeNote, h('div', { class: 'statusline' }, status, sampling), scroller, details)

  const writeHash = () => {
    const q = new URLSearchParams()
    for (const k of filterKeys) if (filters[k]) q.set(k, filters[k])
    const s = q.toString()
    history.replaceState(null, '', '#/flows' + (s ? '?' + s : ''))
  }
  form.addEventListener('submit', (e) => e.preventDefault())
  form.addEventListener('input', (e) => {
    const t = e.target as HTMLInputElement | HTMLSelectElement
    if (t.name in filters) {
      filters[t.name as keyof Filters] = t.value
      writeHash()
      dirty = true
      schedule()
    }
  })
  header.addEventListener('click', (e) => {
    const key = (e.target as HTMLElement).closest('button')?.dataset.key
    if (!key) return
    if (key === sortKey) sortDesc = !sortDesc
    else {
      sortKey = key
      sortDesc = key === 't' || key === 'bytes' || key === 'bps'
    }
    for (const th of header.querySelectorAll<HTMLElement>('[role=columnheader]')) {
      th.setAttribute('aria-sort', th.dataset.key === sortKey ? (sortDesc ? 'descending' : 'ascending') : 'none')
    }
    dirty = true
    schedule()
  })
  pauseBtn.addEventListener('click', () => {
    paused = !paused
    pauseBtn.setAttribute('aria-pressed', String(paused))
    pauseBtn.textContent = paused ? 'Resume' : 'Pause'
    if (!paused) {
      ingest(pending)
      pending = []
    }
    updateStatus()
  })

  const virt = new Virtualizer<HTMLDivElement, HTMLDivElement>({
    count: 0,
    getScrollElement: () => body,
    estimateSize: () => ROW_HEIGHT,
    overscan: 8,
    scrollToFn: elementScroll,
    observeElementRect,
    observeElementOffset,
    onChange: () => schedule(),
  })
  const cleanupVirt = virt._didMount()
  virt._willUpdate()

  // Records come in while the view is sorted and filtered: the new ones
  // are filtered, sorted and merged in, and those that left the kept
  // records taken out; only a change of filter or sort redoes the whole.
  let fresh: Row[] = []
  let trimmed = false
  let match = matcher(filters)
  function ingest(rows: Row[]) {
    if (rows.length === 0) return
    for (const r of rows) all.push(r)
    for (const r of rows) fresh.push(r)
    if (all.length > MAX_ROWS) {
      all = all.slice(all.length - MAX_ROWS)
      trimmed = true
    }
  }

  function comparator(): (a: Row, b: Row) => number {
    const key = (columns.find((c) => c.key === sortKey) ?? columns[0]).sort
    const dir = sortDesc ? -1 : 1
    return (a, b) => {
      const x = key(a), y = key(b)
      return (x < y ? -1 : x > y ? 1 : a.seq - b.seq) * dir
    }
  }

  function recompute() {
    const cmp = comparator()
    if (dirty) {
      match = matcher(filters)
      view = all.filter(match).sort(cmp)
    } else {
      if (trimmed) {
        const oldest = all.length > 0 ? all[0].seq : 0
        view = view.filter((r) => r.seq >= oldest)
      }
      const add = fresh.filter(match).sort(cmp)
      if (add.length > 0) {
        const merged: Row[] = new Array(view.length + add.length)
        let i = 0, j = 0, k = 0
        while (i < view.length && j < add.length) merged[k++] = cmp(view[i], add[j]) <= 0 ? view[i++] : add[j++]
        while (i < view.length) merged[k++] = view[i++]
        while (j < add.length) merged[k++] = add[j++]
        view = merged
      }
    }
    fresh = []
    trimmed = false
    dirty = false
    table.setAttribute('aria-rowcount', String(view.length + 1))
    count.textContent = num(view.length)
    virt.setOptions({ ...virt.options, count: view.length })
    virt._willUpdate()
  }

  let frame = 0
  function schedule() {
    if (frame) return
    frame = requestAnimationFrame(() => {
      frame = 0
      render()
    })
  }

  function render() {
    if (dirty || fresh.length > 0 || trimmed) recompute()
    spacer.style.height = virt.getTotalSize() + 'px'
    const items = virt.getVirtualItems()
    const focusedInside = body.contains(document.activeElement)
    let focusVisible = false
    const els: HTMLElement[] = []
    for (const it of items) {
      const r = view[it.index]
      if (!r) continue
      const denied = r.action === 'Drop' || r.action === 'Reject'
      const el = h('div', { role: 'row', class: 'tr' + (denied ? ' denied' : ''), 'aria-rowindex': it.index + 2, 'data-seq': r.seq, tabindex: -1,
        style: `transform:translateY(${it.start}px)` },
        ...columns.map((c) => h('div', { role: 'cell', class: 'td ' + (c.cls ?? ''), style: `width:${c.width}px` }, c.text(r))))
      if (r.seq === focusSeq) {
        el.tabIndex = 0
        focusVisible = true
      }
      els.push(el)
    }
    if (!focusVisible && els.length > 0) els[0].tabIndex = 0
    spacer.replaceChildren(...els)
    if (focusedInside) {
      const f = spacer.querySelector<HTMLElement>(`[data-seq="${focusSeq}"]`)
      f?.focus({ preventScroll: true })
    }
  }

  // Keyboard: arrows move between rows, Enter opens one.
  body.addEventListener('keydown', (e) => {
    const rowEl = (e.target as HTMLElement).closest<HTMLElement>('[role=row]')
    if (!rowEl) return
    const idx = Number(rowEl.getAttribute('aria-rowindex')) - 2
    let next = -1
    if (e.key === 'ArrowDown') next = Math.min(view.length - 1, idx + 1)
    else if (e.key === 'ArrowUp') next = Math.max(0, idx - 1)
    else if (e.key === 'Home') next = 0
    else if (e.key === 'End') next = view.length - 1
    else if (e.key === 'PageDown') next = Math.min(view.length - 1, idx + 10)
    else if (e.key === 'PageUp') next = Math.max(0, idx - 10)
    else if (e.key === 'Enter' || e.key === ' ') {
      e.preventDefault()
      open(view[idx], rowEl)
      return
    }
    if (next < 0) return
    e.preventDefault()
    focusSeq = view[next].seq
    virt.scrollToIndex(next, { align: 'auto' })
    render()
  })
  body.addEventListener('focusin', (e) => {
    const rowEl = (e.target as HTMLElement).closest<HTMLElement>('[role=row]')
    if (rowEl) focusSeq = Number(rowEl.dataset.seq)
  })
  body.addEventListener('click', (e) => {
    const rowEl = (e.target as HTMLElement).closest<HTMLElement>('[role=row]')
    if (!rowEl) return
    const r = view[Number(rowEl.getAttribute('aria-rowindex')) - 2]
    if (r) {
      focusSeq = r.seq
      open(r, rowEl)
    }
  })

  let detailsAbort: AbortController | null = null
  function open(r: Row, from: HTMLElement) {
    detailsAbort?.abort()
    detailsAbort = new AbortController()
    const dl = h('dl', { class: 'fields' })
    for (const [k, f] of rowFields) {
      const v = f(r)
      if (v === undefined || v === '') continue
      dl.append(h('dt', {}, k), h('dd', {}, String(v)))
    }
    const all = h('dl', { class: 'fields all-fields', 'aria-busy': 'true' })
    const close = h('button', { type: 'button', class: 'close', 'aria-label': 'Close the record' }, '×')
    details.replaceChildren(
      h('div', { class: 'details-head' }, h('h2', { id: 'details-title', tabindex: -1 }, 'Record ' + r.seq), close),
      dl, h('h3', {}, 'Every field (IPFIX element names)'), all)
    details.hidden = false
    const done = () => {
      details.hidden = true
      detailsAbort?.abort()
      const back = spacer.querySelector<HTMLElement>(`[data-seq="${r.seq}"]`) ?? from
      back.focus()
    }
    close.addEventListener('click', done)
    details.onkeydown = (e) => {
      if (e.key === 'Escape') done()
    }
    // The title takes the focus (not the close button, which the Enter
    // that opened the record would press).
    details.querySelector<HTMLElement>('#details-title')?.focus()
    fetch('api/flows/' + r.seq, { signal: detailsAbort.signal }).then(async (resp) => {
      const body = await resp.json()
      all.removeAttribute('aria-busy')
      if (!resp.ok) {
        all.replaceWith(h('p', {}, body.error ?? 'not available'))
        return
      }
      for (const [k, v] of Object.entries(body)) {
        all.append(h('dt', {}, k), h('dd', {}, typeof v === 'object' ? JSON.stringify(v) : String(v)))
      }
    }).catch(() => {})
  }

  let measured = false
  function updateStatus() {
    const now = performance.now()
    const dt = (now - win.since) / 1000
    if (dt >= 1) {
      measured = true
      shown = { got: win.got / dt, skipped: win.skipped / dt, lost: win.lost / dt }
      win.got = win.skipped = win.lost = 0
      win.since = now
    }
    const total = shown.got + shown.skipped + shown.lost
    status.textContent = (paused ? 'Paused (' + num(pending.length) + ' new records waiting) · ' : 'Live · ') +
      (measured ? num(total) + ' records/s from the aggregator' : 'measuring the rate') + ' · ' + num(all.length) + ' kept'
    let s = ''
    if (shown.skipped + shown.lost > 0) {
      s = 'Sampling: showing ' + num(shown.got) + ' of ' + num(total) + ' records/s'
      if (shown.lost > 0) s += ' (' + num(shown.lost) + '/s went past before this page read them)'
    }
    if (tapLost > 0) s += (s ? ' · ' : '') + 'the UI missed ' + num(tapLost) + ' records while busy'
    if (sampling.textContent !== s) sampling.textContent = s
  }

  const es = new EventSource('api/flows/stream')
  es.addEventListener('flows', (ev) => {
    const e = JSON.parse((ev as MessageEvent).data) as FlowEvent
    win.got += e.rows.length
    win.skipped += e.skipped
    win.lost += e.lost
    tapLost = e.tapLost
    if (paused) {
      for (const r of e.rows) pending.push(r)
      if (pending.length > MAX_ROWS) pending = pending.slice(pending.length - MAX_ROWS)
    } else {
      ingest(e.rows)
      schedule()
    }
    if (!measured) updateStatus()
  })
  es.onerror = () => {
    status.textContent = 'Disconnected; reconnecting…'
  }
  const statusTimer = setInterval(() => {
    updateStatus()
    if (filters.since) {
      dirty = true
      schedule()
    }
  }, 1000)

  return () => {
    es.close()
    clearInterval(statusTimer)
    cleanupVirt()
    if (frame) cancelAnimationFrame(frame)
    detailsAbort?.abort()
  }
}
