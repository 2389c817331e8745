// The Policies page: NetworkPolicies recommended from the flows the UI
// holds (a namespace, a time window), verified against the same flows as
// `sluice policy verify` does; the YAML can be edited, verified again and
// downloaded.

import { getJSON, postJSON, type PolicyFlow, type PolicyResult } from './api'
import { h, type Page } from './util'

const windows: [string, string][] = [['5m', 'last 5 minutes'], ['15m', 'last 15 minutes'], ['1h', 'last hour'], ['24h', 'last day'], ['', 'every record held']]

export const policyPage: Page = (root, params) => {
  const ns = h('select', { id: 'pol-ns', name: 'namespace' }, h('option', { value: '' }, 'every namespace'))
  const win = h('select', { id: 'pol-window', name: 'window' }, ...windows.map(([v, t]) => h('option', { value: v }, t)))
  win.value = params.get('window') ?? '1h'
  const iso = h('select', { id: 'pol-isolation', name: 'isolation' },
    h('option', { value: 'both' }, 'ingress and egress'), h('option', { value: 'ingress' }, 'ingress'), h('option', { value: 'egress' }, 'egress'))
  const recommendBtn = h('button', { type: 'submit', id: 'pol-recommend' }, 'Recommend')
  const yaml = h('textarea', { id: 'pol-yaml', name: 'yaml', rows: 18, spellcheck: 'false', 'aria-label': 'Policies (YAML)', placeholder: 'Recommended policies appear here; edit them and verify again' })
  const verifyBtn = h('button', { type: 'button', id: 'pol-verify', disabled: true }, 'Verify again')
  const download = h('a', { id: 'pol-download', class: 'button', download: 'policies.yaml', href: '#', hidden: true }, 'Download')
  const msg = h('p', { class: 'status', role: 'status', 'aria-live': 'polite', id: 'pol-msg' })
  const result = h('section', { id: 'pol-result', 'aria-labelledby': 'pol-result-title', hidden: true })
  const form = h('form', { class: 'trace-form', 'aria-label': 'Recommend policies' },
    h('div', { class: 'row' },
      h('label', { class: 'field', for: 'pol-ns' }, 'Namespace'), ns,
      h('label', { class: 'field', for: 'pol-window' }, 'Flows of the'), win,
      h('label', { class: 'field', for: 'pol-isolation' }, 'Isolation'), iso),
    recommendBtn)
  const editor = h('div', { class: 'trace-form' }, h('label', { class: 'field block', for: 'pol-yaml' }, 'Policies'), yaml,
    h('div', { class: 'statusline' }, verifyBtn, download))
  root.append(h('div', { class: 'page-head' }, h('h1', { tabindex: -1 }, 'Policies')), form, msg, result, editor)

  const ac = new AbortController()
  getJSON<string[]>('api/policy/namespaces', ac.signal).then((list) => {
    ns.append(...list.map((n) => h('option', { value: n }, n)))
    ns.value = params.get('namespace') ?? ''
  }).catch(() => {})

  let url = ''
  const setDownload = () => {
    if (url) URL.revokeObjectURL(url)
    url = URL.createObjectURL(new Blob([yaml.value], { type: 'application/yaml' }))
    download.href = url
    download.hidden = yaml.value.trim() === ''
  }
  yaml.addEventListener('input', () => {
    verifyBtn.disabled = yaml.value.trim() === ''
    setDownload()
  })

  const run = async (path: string, body: object, what: string) => {
    recommendBtn.disabled = verifyBtn.disabled = true
    msg.textContent = what + '…'
    try {
      const res = await postJSON<PolicyResult>(path, body)
      yaml.value = res.yaml
      setDownload()
      draw(res)
      msg.textContent = `${what}: ${res.records} records` + (res.carried !== undefined ? `, ${res.carried} connections carried` : '')
    } catch (e) {
      msg.textContent = 'Cannot ' + what.toLowerCase() + ': ' + (e as Error).message
    } finally {
      recommendBtn.disabled = false
      verifyBtn.disabled = yaml.value.trim() === ''
    }
  }
  form.addEventListener('submit', (ev) => {
    ev.preventDefault()
    void run('api/policy/recommend', { namespace: ns.value, window: win.value, isolation: iso.value }, 'Recommended')
  })
  verifyBtn.addEventListener('click', () => {
    void run('api/policy/verify', { namespace: ns.value, window: win.value, yaml: yaml.value }, 'Verified')
  })

  const flowTable = (id: string, caption: string, flows: PolicyFlow[]) =>
    h('div', { class: 'tscroll' }, h('table', { id },
      h('caption', {}, caption),
      h('thead', {}, h('tr', {}, ...['Source', 'Destination', 'Port', 'Records', 'Last seen', 'Rule'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, ...flows.map((f) => h('tr', {},
        h('td', {}, f.source), h('td', {}, f.destination), h('td', {}, f.protocol + (f.port ? '/' + f.port : '')),
        h('td', {}, String(f.records)), h('td', {}, f.lastSeen ?? ''), h('td', {}, f.rule ?? ''))))))

  function draw(res: PolicyResult) {
    const r = res.report
    const counts = h('dl', { class: 'verify-counts', id: 'pol-counts' },
      h('dt', {}, 'Newly blocked'), h('dd', { 'data-count': 'blocked' }, String(r.newlyBlocked.length)),
      h('dt', {}, 'Newly allowed'), h('dd', { 'data-count': 'allowed' }, String(r.newlyAllowed.length)),
      h('dt', {}, 'Unchanged'), h('dd', { 'data-count': 'unchanged' }, String(r.unchanged)),
      h('dt', {}, 'Unobserved surface'), h('dd', { 'data-count': 'surface' }, String(r.unobservedSurfaceTotal)))
    const surface = h('div', { class: 'tscroll' }, h('table', { id: 'pol-surface' },
      h('caption', {}, 'Allowed, never observed'),
      h('thead', {}, h('tr', {}, ...['Policy', 'Rule', 'Source', 'Destination', 'Port'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, ...r.unobservedSurface.map((s) => h('tr', {},
        h('td', {}, s.policy), h('td', {}, `${s.direction}[${s.rule}]`), h('td', {}, s.source), h('td', {}, s.destination), h('td', {}, s.port))))))
    result.replaceChildren(
      h('h2', { id: 'pol-result-title' }, 'Verified against ' + r.connections + ' connections'),
      counts,
      r.newlyBlocked.length ? flowTable('pol-blocked', 'Observed, allowed now, blocked by these policies', r.newlyBlocked) : '',
      r.newlyAllowed.length ? flowTable('pol-allowed', 'Denied now, allowed by these policies', r.newlyAllowed) : '',
      r.unobservedSurface.length ? surface : '',
      r.unobservedSurfaceNote ? h('p', { class: 'status' }, r.unobservedSurfaceNote) : '')
    result.hidden = false
  }

  return () => {
    ac.abort()
    if (url) URL.revokeObjectURL(url)
  }
}
