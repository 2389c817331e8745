// The Traceflow page: a form for what `sluice traceflow -S -D -f --with`
// takes, the trace drawn Node by Node with each observation, and the YAML
// the command prints for the same request.

import { getJSON, postJSON, type Observation, type TraceResult } from './api'
import { h, type Page } from './util'

// flowSpec is the -f value of the form's protocol and ports.
export function flowSpec(proto: string, sport: string, dport: string): string {
  if (proto === 'icmp' || proto === '') return ''
  const parts = [proto]
  if (sport) parts.push(`${proto}_src=${sport}`)
  if (dport) parts.push(`${proto}_dst=${dport}`)
  return parts.join(',')
}

// What an observation says beside its component and action.
const obsFields: [keyof Observation, string][] = [
  ['componentInfo', 'table'], ['pod', 'Pod'], ['networkPolicy', 'policy'], ['networkPolicyRule', 'rule'],
  ['translatedDstIP', 'to'], ['translatedSrcIP', 'from'], ['egress', 'Egress'], ['egressIP', 'Egress IP'], ['egressNode', 'Egress Node'],
  ['tunnelDstIP', 'tunnel to'], ['dstMAC', 'MAC'], ['srcPodIP', 'source IP'], ['ttl', 'TTL'],
]

export const tracePage: Page = (root, params) => {
  const src = h('input', { id: 'tf-src', name: 'source', required: true, list: 'tf-pods', placeholder: 'namespace/pod', autocomplete: 'off', value: params.get('source') ?? '' })
  const dst = h('input', { id: 'tf-dst', name: 'destination', required: true, list: 'tf-dsts', placeholder: 'namespace/pod, namespace/service or an IP', autocomplete: 'off', value: params.get('destination') ?? '' })
  const proto = h('select', { id: 'tf-proto', name: 'protocol' },
    h('option', { value: 'icmp' }, 'ICMP echo'), h('option', { value: 'tcp' }, 'TCP'), h('option', { value: 'udp' }, 'UDP'))
  const sport = h('input', { id: 'tf-sport', name: 'sport', type: 'number', min: 1, max: 65535, inputmode: 'numeric', placeholder: 'any' })
  const dport = h('input', { id: 'tf-dport', name: 'dport', type: 'number', min: 1, max: 65535, inputmode: 'numeric', placeholder: 'e.g. 80' })
  const withText = h('textarea', { id: 'tf-with', name: 'with', rows: 6, spellcheck: 'false', placeholder: 'Optional: objects to overlay (a new policy, a changed Egress), as YAML' })
  const pods = h('datalist', { id: 'tf-pods' })
  const dsts = h('datalist', { id: 'tf-dsts' })
  const cmd = h('code', { id: 'tf-cmd' })
  const submit = h('button', { type: 'submit' }, 'Trace')
  const msg = h('p', { class: 'status', role: 'status', 'aria-live': 'polite', id: 'tf-msg' })
  const result = h('section', { class: 'trace-result', 'aria-labelledby': 'tf-result-title', hidden: true })
  const form = h('form', { class: 'trace-form', 'aria-label': 'Trace a packet' },
    h('div', { class: 'row' },
      h('label', { class: 'field', for: 'tf-src' }, 'Source Pod'), src,
      h('label', { class: 'field', for: 'tf-dst' }, 'Destination (Pod, Service or IP)'), dst),
    h('div', { class: 'row' },
      h('label', { class: 'field', for: 'tf-proto' }, 'Protocol'), proto,
      h('label', { class: 'field', for: 'tf-sport' }, 'Source port'), sport,
      h('label', { class: 'field', for: 'tf-dport' }, 'Destination port'), dport),
    h('label', { class: 'field block', for: 'tf-with' }, 'What-if manifest (optional)'), withText,
    h('p', { class: 'cmd' }, 'Same as ', cmd),
    submit, pods, dsts)
  root.append(h('div', { class: 'page-head' }, h('h1', { tabindex: -1 }, 'Traceflow')), form, msg, result)

  const request = () => ({ source: src.value.trim(), destination: dst.value.trim(), flow: flowSpec(proto.value, sport.value, dport.value), with: withText.value })
  const showCmd = () => {
    const r = request()
    const q = (s: string) => (/^[\w./:=,-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\\''") + "'")
    cmd.textContent = 'sluice traceflow -S ' + q(r.source || 'NS/POD') + ' -D ' + q(r.destination || 'DEST') + (r.flow ? ' -f ' + q(r.flow) : '') +
      (r.with.trim() ? ' --with FILE' : '') + ' --cluster …'
  }
  const toggleSport = () => {
    const icmp = proto.value === 'icmp'
    sport.disabled = dport.disabled = icmp
  }
  form.addEventListener('input', showCmd)
  proto.addEventListener('change', () => {
    toggleSport()
    showCmd()
  })
  toggleSport()
  showCmd()

  const ac = new AbortController()
  getJSON<{ pods: string[]; services: string[] }>('api/traceflow/endpoints', ac.signal).then((e) => {
    pods.replaceChildren(...e.pods.map((p) => h('option', { value: p })))
    dsts.replaceChildren(...[...e.pods, ...e.services].map((p) => h('option', { value: p })))
  }).catch(() => {})

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault()
    submit.disabled = true
    msg.textContent = 'Tracing…'
    try {
      const res = await postJSON<TraceResult>('api/traceflow', request())
      draw(res)
      msg.textContent = 'Trace ' + (res.summary.phase ?? '') + (res.summary.reason ? ': ' + res.summary.reason : '')
    } catch (e) {
      result.hidden = true
      msg.textContent = 'Cannot trace: ' + (e as Error).message
    } finally {
      submit.disabled = false
    }
  })

  function draw(res: TraceResult) {
    const s = res.summary
    const lanes = h('ol', { class: 'lanes', 'aria-label': 'Nodes the packet crossed, in order' })
    for (const [i, n] of (s.results ?? []).entries()) {
      const obs = h('ol', { class: 'observations' })
      for (const o of n.observations ?? []) {
        const act = (o.action ?? '').toLowerCase()
        const details = h('dl', {})
        for (const [k, label] of obsFields) {
          const v = o[k]
          if (v !== undefined && v !== '' && v !== 0) details.append(h('dt', {}, label), h('dd', {}, String(v)))
        }
        obs.append(h('li', { class: 'obs ' + act, 'data-component': o.component, 'data-action': o.action ?? '' },
          h('span', { class: 'component' }, o.component), ' ', h('span', { class: 'action' }, o.action ?? ''), details))
      }
      lanes.append(h('li', { class: 'lane' },
        h('h3', {}, h('span', { class: 'step' }, String(i + 1)), ' Node ', h('span', { class: 'node-name' }, n.node), n.role ? h('span', { class: 'role' }, ' · ' + n.role) : null),
        obs))
    }
    const phase = (s.phase ?? '').toLowerCase()
    result.replaceChildren(
      h('h2', { id: 'tf-result-title' }, s.name),
      h('p', {}, h('span', { class: 'phase ' + phase }, s.phase ?? ''), ' ', s.source, ' → ', s.destination, s.reason ? ' · ' + s.reason : ''),
      lanes,
      res.warnings?.length ? h('details', {}, h('summary', {}, 'Warnings about the cluster state'), h('ul', {}, ...res.warnings.map((w) => h('li', {}, w)))) : '',
      h('h3', {}, 'As ', h('code', {}, 'sluice traceflow'), ' prints it'),
      h('pre', { class: 'yaml', id: 'tf-yaml', tabindex: 0, 'aria-label': 'YAML output' }, res.yaml))
    result.hidden = false
  }

  return () => ac.abort()
}
