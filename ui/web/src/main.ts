import './style.css'
import { getJSON, type Info } from './api'
import { flowsPage } from './flows'
import { mapPage } from './map'
import { tracePage } from './trace'
import { healthPage } from './health'
import { policyPage } from './policy'
import type { Page } from './util'

const pages: Record<string, { title: string; page: Page }> = {
  flows: { title: 'Flows', page: flowsPage },
  map: { title: 'Map', page: mapPage },
  traceflow: { title: 'Traceflow', page: tracePage },
  policies: { title: 'Policies', page: policyPage },
  health: { title: 'Health', page: healthPage },
}

const main = document.getElementById('main') as HTMLElement
let stop: (() => void) | null = null
let current = ''

// route mounts the page the hash names: #/name?filters.
function route() {
  const hash = location.hash.replace(/^#\/?/, '')
  const [name0, query = ''] = hash.split('?')
  const name = pages[name0] ? name0 : 'flows'
  const key = name + '?' + query
  if (key === current) return
  current = key
  stop?.()
  main.replaceChildren()
  const p = pages[name]
  document.title = p.title + ' · Sluice'
  for (const a of document.querySelectorAll<HTMLAnchorElement>('nav a')) {
    if (a.dataset.page === name) a.setAttribute('aria-current', 'page')
    else a.removeAttribute('aria-current')
  }
  stop = p.page(main, new URLSearchParams(query))
  // Move the focus to the page, as a page load would, when the user
  // navigated (not on the first load).
  if (document.activeElement && document.activeElement !== document.body) {
    main.querySelector<HTMLElement>('h1')?.focus()
  }
}

window.addEventListener('hashchange', route)
route()

getJSON<Info>('api/info').then((info) => {
  const mode = document.getElementById('mode')
  if (mode) mode.textContent = info.mode + ' mode'
  const n = document.getElementById('notice')
  if (n && info.notice) {
    n.textContent = info.notice
    n.hidden = false
  }
}).catch(() => {})

// The skip link moves the focus without touching the hash (the router's).
document.querySelector('.skip')?.addEventListener('click', (e) => {
  e.preventDefault()
  main.focus()
})
