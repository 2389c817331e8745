package controller

import (
	"context"
	"sync"
)

// queue is a FIFO of distinct names with a cap. A name already queued, or
// being processed, is not queued twice; a name is refused when the queue
// is full.
type queue struct {
	mu    sync.Mutex
	items []string
	queued,
	busy map[string]bool
	cap  int
	wake chan struct{}
}

func newQueue(capacity int) *queue {
	return &queue{queued: map[string]bool{}, busy: map[string]bool{}, cap: capacity, wake: make(chan struct{}, 1)}
}

// add queues name; it reports false when the queue is full.
func (q *queue) add(name string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued[name] || q.busy[name] {
		return true
	}
	if len(q.items) >= q.cap {
		return false
	}
	q.items = append(q.items, name)
	q.queued[name] = true
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// get waits for a name, or for ctx to end (false). The name is busy until
// done.
func (q *queue) get(ctx context.Context) (string, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			name := q.items[0]
			q.items[0] = ""
			q.items = q.items[1:]
			delete(q.queued, name)
			q.busy[name] = true
			q.mu.Unlock()
			return name, true
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", false
		case <-q.wake:
		}
	}
}

func (q *queue) done(name string) {
	q.mu.Lock()
	delete(q.busy, name)
	q.mu.Unlock()
}

func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}
