// The JSON the Go package ui serves (see ui/*.go for the field meanings).

export interface Row {
  seq: number
  t: number
  start: number
  srcNs?: string
  srcPod?: string
  srcWl?: string
  // The kind of the Pod's controller (Deployment, StatefulSet...); absent
  // when the workload is guessed from the Pod's labels or name.
  srcWlKind?: string
  srcNode?: string
  srcIp: string
  srcPort: number
  dstNs?: string
  dstPod?: string
  dstWl?: string
  dstWlKind?: string
  dstNode?: string
  dstIp: string
  dstPort: number
  svc?: string
  proto: string
  bytes: number
  delta: number
  bps: number
  policy?: string
  action?: string
  egress?: string
  egressIp?: string
  egressNode?: string
  type?: string
}

export interface FlowEvent {
  rows: Row[]
  lost: number
  skipped: number
  tapLost: number
  seq: number
}

export interface Info {
  mode: string
  notice?: string
  traceflow: boolean
  maxPerSecond: number
}

export interface Endpoint {
  id: string
  kind: 'pod' | 'external' | 'egress'
  ns?: string
  wl?: string
  wlKind?: string
  pod?: string
  node?: string
  ip?: string
  egress?: string
}

export interface Edge {
  from: string
  to: string
  flows: number
  denied: number
  bytes: number
  bps: number
  svc?: string
  proto?: string
  port?: number
  lastSeen: number
}

export interface Graph {
  endpoints: Endpoint[]
  edges: Edge[]
  evicted: number
}

export interface ExporterHealth {
  address: string
  transport: string
  records: number
  rate: number
  active: boolean
  unknown: number
  missing: number
  profile: string
}

export interface Health {
  at: number
  mode: string
  exporters: ExporterHealth[]
  sessions: Record<string, number>
  in: number
  out: number
  drops: { series: string; labels: Record<string, string>; total: number; rate: number }[]
  sinks: { name: string; connected: boolean; exported: number; rate: number; dropped: number }[]
  ui: { seen: number; dropped: number }
}

export interface Observation {
  component: string
  componentInfo?: string
  action?: string
  pod?: string
  dstMAC?: string
  networkPolicy?: string
  networkPolicyRule?: string
  egress?: string
  egressIP?: string
  egressNode?: string
  ttl?: number
  translatedSrcIP?: string
  translatedDstIP?: string
  tunnelDstIP?: string
  srcPodIP?: string
}

export interface NodeResult {
  node: string
  role?: string
  timestamp?: number
  observations?: Observation[]
}

export interface TraceSummary {
  name: string
  phase?: string
  reason?: string
  source: string
  destination: string
  results?: NodeResult[]
}

export interface TraceResult {
  summary: TraceSummary
  yaml: string
  warnings?: string[]
}

export async function getJSON<T>(path: string, signal?: AbortSignal): Promise<T> {
  const r = await fetch(path, { signal, headers: { Accept: 'application/json' } })
  const body = await r.json()
  if (!r.ok) throw new Error(body?.error ?? r.statusText)
  return body as T
}

export async function postJSON<T>(path: string, v: unknown): Promise<T> {
  const r = await fetch(path, { method: 'POST', body: JSON.stringify(v), headers: { 'Content-Type': 'application/json' } })
  const body = await r.json()
  if (!r.ok) throw new Error(body?.error ?? r.statusText)
  return body as T
}

// The Policies page (ui/policy.go, policy/verify).
export interface PolicyFlow {
  source: string
  destination: string
  protocol: string
  port?: number
  service?: string
  records: number
  firstSeen?: string
  lastSeen?: string
  rule?: string
}

export interface PolicySurface {
  policy: string
  direction: string
  rule: number
  source: string
  destination: string
  port: string
}

export interface PolicyReport {
  connections: number
  records: number
  newlyBlocked: PolicyFlow[]
  newlyAllowed: PolicyFlow[]
  unchanged: number
  notModelled: number
  errors: number
  unobservedSurface: PolicySurface[]
  unobservedSurfaceTotal: number
  unobservedSurfaceNote?: string
}

export interface PolicyResult {
  yaml: string
  report: PolicyReport
  records: number
  carried?: number
}
