// The Map page: endpoints grouped by namespace, workload or Pod as nodes,
// traffic as edges weighted by throughput, drawn and laid out by
// Cytoscape.js; outside addresses and Egress IPs are nodes of their own;
// denied edges are dashed and red. An edge opens the Flows page filtered
// to it; the table under the graph lists the same edges for keyboards and
// screen readers.

import cytoscape from 'cytoscape'
import { getJSON, type Endpoint, type Graph } from './api'
import { bits, h, num, type Page } from './util'

type Grouping = 'ns' | 'wl' | 'pod'

interface GNode {
  id: string
  label: string
  kind: string
  detail: string
}
interface GEdge {
  id: string
  source: string
  target: string
  flows: number
  denied: number
  bps: number
  bytes: number
  what: Set<string>
}

// groupKey names an endpoint's node at a grouping; the Flows page reads
// the same keys back (from=, to=).
function groupKey(e: Endpoint, g: Grouping): { id: string; label: string; detail: string } {
  if (e.kind === 'external') return { id: e.id, label: e.ip ?? e.id, detail: 'outside the cluster' }
  if (e.kind === 'egress') return { id: e.id, label: (e.egress ?? '') + '\n' + (e.ip ?? ''), detail: 'Egress IP' + (e.node ? ' on ' + e.node : '') }
  switch (g) {
    case 'ns':
      return { id: 'ns:' + e.ns, label: e.ns ?? '', detail: 'namespace' }
    case 'wl':
      return { id: 'wl:' + e.ns + '/' + e.wl, label: e.ns + '/' + e.wl, detail: e.wlKind ?? 'workload' }
  }
  return { id: 'pod:' + e.ns + '/' + e.pod, label: e.ns + '/' + e.pod, detail: 'Pod' + (e.node ? ' on ' + e.node : '') }
}

function build(graph: Graph, g: Grouping): { nodes: Map<string, GNode>; edges: Map<string, GEdge> } {
  const byId = new Map(graph.endpoints.map((e) => [e.id, e]))
  const nodes = new Map<string, GNode>()
  const edges = new Map<string, GEdge>()
  const node = (id: string) => {
    const e = byId.get(id)
    if (!e) return null
    const k = groupKey(e, g)
    if (!nodes.has(k.id)) nodes.set(k.id, { id: k.id, label: k.label, kind: e.kind, detail: k.detail })
    return k.id
  }
  for (const e of graph.edges) {
    const s = node(e.from), t = node(e.to)
    if (!s || !t) continue
    const id = s + '→' + t
    let ge = edges.get(id)
    if (!ge) {
      ge = { id, source: s, target: t, flows: 0, denied: 0, bps: 0, bytes: 0, what: new Set() }
      edges.set(id, ge)
    }
    ge.flows += e.flows
    ge.denied += e.denied
    ge.bps += e.bps
    ge.bytes += e.bytes
    if (e.svc) ge.what.add(e.svc)
    else if (e.proto && e.port) ge.what.add(e.proto + '/' + e.port)
  }
  return { nodes, edges }
}

const style: cytoscape.StylesheetJson = [
  { selector: 'node', style: { label: 'data(label)', 'font-size': 12, 'text-wrap': 'wrap', 'text-valign': 'bottom', 'text-margin-y': 4, 'background-color': '#2f6fba', width: 26, height: 26, color: '#1b1f24' } },
  { selector: 'node[kind="external"]', style: { shape: 'diamond', 'background-color': '#7a5c99' } },
  { selector: 'node[kind="egress"]', style: { shape: 'hexagon', 'background-color': '#c77700', width: 32, height: 32 } },
  { selector: 'edge', style: { width: 'data(w)', 'line-color': '#7d8a99', 'target-arrow-color': '#7d8a99', 'target-arrow-shape': 'triangle', 'curve-style': 'bezier', 'arrow-scale': 0.8 } },
  { selector: 'edge[denied > 0]', style: { 'line-color': '#c62828', 'target-arrow-color': '#c62828', 'line-style': 'dashed', 'target-arrow-shape': 'tee' } },
  { selector: ':selected', style: { 'overlay-opacity': 0.2, 'overlay-color': '#2f6fba' } },
]

export const mapPage: Page = (root, params) => {
  let grouping: Grouping = (['ns', 'wl', 'pod'].includes(params.get('group') ?? '') ? params.get('group') : 'wl') as Grouping
  const groupSel = h('select', { name: 'group' },
    h('option', { value: 'ns', selected: grouping === 'ns' }, 'namespace'),
    h('option', { value: 'wl', selected: grouping === 'wl' }, 'workload'),
    h('option', { value: 'pod', selected: grouping === 'pod' }, 'Pod'))
  const status = h('p', { class: 'status', id: 'map-status' }, 'Loading…')
  const freeze = h('button', { type: 'button', class: 'freeze', 'aria-pressed': 'false' }, 'Freeze')
  let frozen = false
  freeze.addEventListener('click', () => {
    frozen = !frozen
    freeze.setAttribute('aria-pressed', String(frozen))
    freeze.textContent = frozen ? 'Update' : 'Freeze'
    if (!frozen) load()
  })
  const canvas = h('div', { class: 'cy', id: 'cy', role: 'img', 'aria-label': 'Service map: nodes are endpoints, arrows are traffic; the table below lists the same edges' })
  const legend = h('ul', { class: 'legend', 'aria-label': 'Legend' },
    h('li', {}, h('span', { class: 'sw pod' }), 'namespace, workload or Pod'),
    h('li', {}, h('span', { class: 'sw ext' }), 'outside address'),
    h('li', {}, h('span', { class: 'sw egress' }), 'Egress IP'),
    h('li', {}, h('span', { class: 'sw denied' }), 'denied by a policy rule (dashed)'),
    h('li', {}, 'line width: throughput'))
  const tbody = h('tbody')
  const table = h('table', { class: 'edges' },
    h('caption', {}, 'Edges (open one to see its flows)'),
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'From'), h('th', { scope: 'col' }, 'To'), h('th', { scope: 'col' }, 'Traffic'),
      h('th', { scope: 'col', class: 'num' }, 'Throughput'), h('th', { scope: 'col', class: 'num' }, 'Records'), h('th', { scope: 'col', class: 'num' }, 'Denied'))),
    tbody)
  root.append(
    h('div', { class: 'page-head' }, h('h1', { tabindex: -1 }, 'Map'),
      h('label', { class: 'field inline' }, 'Group by', groupSel), freeze),
    status, h('div', { class: 'map-wrap' }, canvas, legend), h('div', { class: 'tscroll' }, table))

  const cy = cytoscape({ container: canvas, style, minZoom: 0.2, maxZoom: 3, wheelSensitivity: 0.3, boxSelectionEnabled: false })
  // For the browser tests and the curious: the drawn graph.
  ;(window as unknown as { sluiceMap?: cytoscape.Core }).sluiceMap = cy
  cy.on('tap', 'edge', (e) => {
    const d = e.target.data()
    location.hash = '#/flows?' + new URLSearchParams({ from: d.source, to: d.target }).toString()
  })

  let last: Graph | null = null
  let nodeSet = ''
  function draw() {
    if (!last) return
    const { nodes, edges } = build(last, grouping)
    const maxBps = Math.max(1, ...[...edges.values()].map((e) => e.bps))
    const w = (bps: number) => 1.5 + 8 * Math.sqrt(bps / maxBps)
    const labelOf = (id: string) => nodes.get(id)?.label.replace('\n', ' ') ?? id
    // Elements are updated in place; the layout runs again only when the
    // nodes change, so that the picture holds still while traffic flows.
    const newNodeSet = [...nodes.keys()].sort().join('|')
    cy.batch(() => {
      cy.elements().filter((el) => (el.isNode() ? !nodes.has(el.id()) : !edges.has(el.id()))).remove()
      for (const n of nodes.values()) {
        if (cy.getElementById(n.id).empty()) cy.add({ group: 'nodes', data: { id: n.id, label: n.label, kind: n.kind } })
      }
      for (const e of edges.values()) {
        const data = { denied: e.denied, flows: e.flows, bps: e.bps, w: w(e.bps) }
        const el = cy.getElementById(e.id)
        if (el.empty()) cy.add({ group: 'edges', data: { id: e.id, source: e.source, target: e.target, ...data } })
        else el.data(data)
      }
    })
    if (newNodeSet !== nodeSet) {
      nodeSet = newNodeSet
      cy.layout({ name: 'cose', animate: false, randomize: false, nodeDimensionsIncludeLabels: true, padding: 16,
        idealEdgeLength: () => 70, nodeRepulsion: () => 20000, gravity: 0.3, componentSpacing: 60 } as cytoscape.LayoutOptions).run()
    }
    const rows = [...edges.values()].sort((a, b) => b.bps - a.bps)
    tbody.replaceChildren(...rows.map((e) => {
      const href = '#/flows?' + new URLSearchParams({ from: e.source, to: e.target }).toString()
      return h('tr', { class: e.denied > 0 ? 'denied' : '' },
        h('td', {}, h('a', { href }, labelOf(e.source))), h('td', {}, labelOf(e.target)),
        h('td', {}, [...e.what].slice(0, 3).join(', ')), h('td', { class: 'num' }, bits(e.bps)),
        h('td', { class: 'num' }, num(e.flows)), h('td', { class: 'num' }, e.denied > 0 ? num(e.denied) + ' denied' : '0'))
    }))
    const denied = rows.filter((e) => e.denied > 0).length
    status.textContent = num(nodes.size) + ' nodes, ' + num(edges.size) + ' edges (' + num(denied) + ' denied)' +
      (last.evicted > 0 ? ' · ' + num(last.evicted) + ' old edges forgotten at the cap' : '')
  }

  groupSel.addEventListener('change', () => {
    grouping = groupSel.value as Grouping
    history.replaceState(null, '', '#/map?group=' + grouping)
    cy.elements().remove()
    nodeSet = ''
    draw()
  })

  const ac = new AbortController()
  async function load() {
    if (frozen) return
    try {
      last = await getJSON<Graph>('api/map', ac.signal)
      draw()
    } catch (e) {
      if (!ac.signal.aborted) status.textContent = 'Cannot read the map: ' + (e as Error).message
    }
  }
  load()
  const timer = setInterval(load, 3000)
  return () => {
    ac.abort()
    clearInterval(timer)
    cy.destroy()
    delete (window as unknown as { sluiceMap?: cytoscape.Core }).sluiceMap
  }
}
