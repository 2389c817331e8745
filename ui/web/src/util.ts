// Small DOM and formatting helpers shared by the pages.

type Attrs = Record<string, string | number | boolean | undefined | null | EventListener>

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: (Node | string | null | undefined | false)[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue
    if (typeof v === 'function') el.addEventListener(k.replace(/^on/, ''), v)
    else if (v === true) el.setAttribute(k, '')
    else el.setAttribute(k, String(v))
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue
    el.append(typeof c === 'string' ? document.createTextNode(c) : c)
  }
  return el
}

export function bytes(n: number): string {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024
    i++
  }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + ' ' + u[i]
}

export function bits(n: number): string {
  const u = ['bit/s', 'kbit/s', 'Mbit/s', 'Gbit/s']
  let i = 0
  while (n >= 1000 && i < u.length - 1) {
    n /= 1000
    i++
  }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + ' ' + u[i]
}

export function num(n: number, digits = 0): string {
  return n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits })
}

export function time(ms: number): string {
  if (!ms) return ''
  const d = new Date(ms)
  return d.toISOString().slice(11, 19)
}

export function podName(ns?: string, pod?: string): string {
  return pod ? (ns ? ns + '/' + pod : pod) : ''
}

// Page is what the router mounts: it builds its DOM into root and stops
// its timers and streams in the returned function.
export type Page = (root: HTMLElement, params: URLSearchParams) => () => void
