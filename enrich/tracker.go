package enrich

import (
	"sync"
	"sync/atomic"
	"time"
)

// tracker is the write side shared by the Stores that follow a changing
// cluster: it keeps the current objects, remembers deleted ones for the
// retention time and publishes immutable snapshots for lock-free readers.
//
// Writers describe changes in a txn, either as a full state (replaceAll, for
// a re-read inventory or an informer resync) or as single events
// (setPod/deletePod and friends, for informer handlers). Every update
// rebuilds the snapshot, so event-driven writers should batch events into one
// update.
type tracker struct {
	retention time.Duration

	mu         sync.Mutex // serialises writers; guards the fields below
	pods       map[string]*Pod
	nodes      map[string]trackedNode
	services   map[serviceKey]trackedService
	nextExpiry time.Time // earliest time a remembered object must be forgotten; zero if none

	cur atomic.Pointer[snapshot]
}

type trackedNode struct {
	node    *Node
	deleted time.Time
}

type trackedService struct {
	service *Service
	deleted time.Time
}

func newTracker(retention time.Duration) *tracker {
	t := &tracker{
		retention: retention,
		pods:      make(map[string]*Pod),
		nodes:     make(map[string]trackedNode),
		services:  make(map[serviceKey]trackedService),
	}
	t.cur.Store(buildSnapshot(nil, nil, nil))
	return t
}

func (t *tracker) snapshot() *snapshot { return t.cur.Load() }

// update runs fn (if not nil) under the writer lock, forgets deleted objects
// whose retention has passed at now, and publishes a new snapshot.
func (t *tracker) update(now time.Time, fn func(tx *txn)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if fn != nil {
		fn(&txn{t: t, now: now})
	}
	t.publish(now)
}

// expire publishes a new snapshot if a remembered deleted object has
// outlived the retention at now. It is cheap when nothing expires.
func (t *tracker) expire(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nextExpiry.IsZero() || now.Before(t.nextExpiry) {
		return
	}
	t.publish(now)
}

func (t *tracker) publish(now time.Time) {
	var next time.Time
	keep := func(deleted time.Time) bool {
		if deleted.IsZero() {
			return true
		}
		exp := deleted.Add(t.retention)
		if !now.Before(exp) {
			return false
		}
		if next.IsZero() || exp.Before(next) {
			next = exp
		}
		return true
	}
	pods := make([]*Pod, 0, len(t.pods))
	for id, p := range t.pods {
		if !keep(p.Deleted) {
			delete(t.pods, id)
			continue
		}
		pods = append(pods, p)
	}
	nodes := make([]*Node, 0, len(t.nodes))
	for name, n := range t.nodes {
		if !keep(n.deleted) {
			delete(t.nodes, name)
			continue
		}
		nodes = append(nodes, n.node)
	}
	services := make([]*Service, 0, len(t.services))
	var live []*Service
	for key, s := range t.services {
		if !keep(s.deleted) {
			delete(t.services, key)
			continue
		}
		if s.deleted.IsZero() {
			live = append(live, s.service)
		} else {
			services = append(services, s.service)
		}
	}
	services = append(services, live...) // deleted first: see buildSnapshot
	t.nextExpiry = next
	t.cur.Store(buildSnapshot(pods, nodes, services))
}

// txn is a set of changes made at one time, under the tracker's writer lock.
type txn struct {
	t   *tracker
	now time.Time
}

// podKey identifies a Pod across updates: its UID, or, for hand-written
// objects without one, its namespace, name and creation time.
func podKey(p *Pod) string {
	if p.UID != "" {
		return p.UID
	}
	return "\x00" + p.Namespace + "/" + p.Name + "@" + p.Created.UTC().Format(time.RFC3339Nano)
}

// setPod adds or updates a live Pod (normalized by normalizePod). A Pod seen
// again with the same identity after it was deleted is alive again. A
// finished Pod is remembered as deleted since it finished (Pod.Finished),
// or since it was first seen finished: so one that finished longer ago
// than the retention is forgotten at once, and is not remembered again
// by a later update.
func (tx *txn) setPod(p *Pod) {
	if p.Finished {
		at := p.Deleted
		if at.IsZero() {
			at = tx.now
		}
		if old, ok := tx.t.pods[podKey(p)]; ok && !old.Deleted.IsZero() && old.Deleted.Before(at) {
			at = old.Deleted
		}
		q := *p
		q.Deleted = at
		tx.t.pods[podKey(p)] = &q
		return
	}
	if !p.Deleted.IsZero() {
		q := *p
		q.Deleted = time.Time{}
		p = &q
	}
	tx.t.pods[podKey(p)] = p
}

// deletePod marks the Pod with the given identity (see podKey) deleted now;
// it is remembered for the retention time.
func (tx *txn) deletePod(key string) {
	p, ok := tx.t.pods[key]
	if !ok || !p.Deleted.IsZero() {
		return
	}
	q := *p // readers may hold p: never modify it
	q.Deleted = tx.now
	tx.t.pods[key] = &q
}

func (tx *txn) setNode(n *Node) { tx.t.nodes[n.Name] = trackedNode{node: n} }

func (tx *txn) deleteNode(name string) {
	if n, ok := tx.t.nodes[name]; ok && n.deleted.IsZero() {
		n.deleted = tx.now
		tx.t.nodes[name] = n
	}
}

func (tx *txn) setService(s *Service) {
	tx.t.services[serviceKey{s.Namespace, s.Name}] = trackedService{service: s}
}

func (tx *txn) deleteService(namespace, name string) {
	key := serviceKey{namespace, name}
	if s, ok := tx.t.services[key]; ok && s.deleted.IsZero() {
		s.deleted = tx.now
		tx.t.services[key] = s
	}
}

// replaceAll makes the given objects the complete live state: objects that
// are not among them any more are deleted now.
func (tx *txn) replaceAll(pods []*Pod, nodes []*Node, services []*Service) {
	seenPods := make(map[string]struct{}, len(pods))
	for _, p := range pods {
		tx.setPod(p)
		seenPods[podKey(p)] = struct{}{}
	}
	for key := range tx.t.pods {
		if _, ok := seenPods[key]; !ok {
			tx.deletePod(key)
		}
	}
	seenNodes := make(map[string]struct{}, len(nodes))
	for _, n := range nodes {
		tx.setNode(n)
		seenNodes[n.Name] = struct{}{}
	}
	for name := range tx.t.nodes {
		if _, ok := seenNodes[name]; !ok {
			tx.deleteNode(name)
		}
	}
	seenServices := make(map[serviceKey]struct{}, len(services))
	for _, s := range services {
		tx.setService(s)
		seenServices[serviceKey{s.Namespace, s.Name}] = struct{}{}
	}
	for key := range tx.t.services {
		if _, ok := seenServices[key]; !ok {
			tx.deleteService(key.namespace, key.name)
		}
	}
}
