package enrich

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"
)

// DefaultInventoryInterval is how often an Inventory checks its file.
const DefaultInventoryInterval = 2 * time.Second

// InventoryOptions configures an Inventory. The zero value gives the
// defaults.
type InventoryOptions struct {
	// Interval is how often Run checks the file; DefaultInventoryInterval if
	// zero.
	Interval time.Duration
	// Retention is how long deleted Pods, Nodes and Services are remembered;
	// DefaultRetention if zero.
	Retention time.Duration
	// Now is the clock used to stamp deletions and expire them; time.Now if
	// nil.
	Now func() time.Time
	// Logger receives load and reload events; slog.Default() if nil.
	Logger *slog.Logger
}

// Inventory is a Store read from a file in the format printed by
// `kubectl get pods,nodes,services -A -o yaml`: a v1 List of Pods, Nodes and
// Services, or a multi-document YAML stream of such objects or lists. The
// same in JSON (-o json) is read much faster.
//
// Run re-reads the file when it changes. Objects missing from the new
// contents are deleted at the time of the reload and remembered for the
// retention time; a Pod whose IP now belongs to an object with another UID is
// the old Pod deleted and a new one created. A file that cannot be read or
// parsed leaves the previous data in use.
//
// Pods that use the host network are not indexed: their IP is the Node's.
type Inventory struct {
	path     string
	interval time.Duration
	now      func() time.Time
	log      *slog.Logger
	t        *tracker

	loadMu     sync.Mutex // serialises loads; guards the fields below
	loadedHash [sha256.Size]byte
	attempted  os.FileInfo // the file's state at the last read, nil if none
	pending    os.FileInfo // a changed state seen by the last poll, waiting to settle
	statErr    string      // the last stat failure, so that a lasting one is reported once

	statsMu sync.Mutex // guards stats
	stats   InventoryStats
}

var _ Store = (*Inventory)(nil)

// InventoryStats describes an Inventory's loads and current data.
type InventoryStats struct {
	// Loads counts reads of the file that produced new data, the first
	// included.
	Loads uint64
	// LoadErrors counts failures to read or parse the file; each left the
	// previous data in use.
	LoadErrors uint64
	// LastLoad is when new data was last loaded (by the Now clock).
	LastLoad time.Time
	// LastError is the most recent failure, "" if the last read succeeded.
	LastError string
	// Current data: live Pods, deleted Pods still remembered, Nodes and
	// Services (deleted ones still remembered included).
	Pods, DeletedPods, Nodes, Services int
	// In the last loaded file: Pods left out because they use the host
	// network, and objects of other kinds or API versions.
	HostNetworkPods, Ignored int
}

// NewInventory loads the inventory file at path. It fails if the file cannot
// be read or parsed. Call Run to follow changes to the file.
func NewInventory(path string, opts InventoryOptions) (*Inventory, error) {
	if opts.Interval < 0 {
		return nil, fmt.Errorf("inventory: negative interval %v", opts.Interval)
	}
	if opts.Retention < 0 {
		return nil, fmt.Errorf("inventory: negative retention %v", opts.Retention)
	}
	inv := &Inventory{
		path:     path,
		interval: opts.Interval,
		now:      opts.Now,
		log:      opts.Logger,
	}
	if inv.interval == 0 {
		inv.interval = DefaultInventoryInterval
	}
	if inv.now == nil {
		inv.now = time.Now
	}
	if inv.log == nil {
		inv.log = slog.Default()
	}
	retention := opts.Retention
	if retention == 0 {
		retention = DefaultRetention
	}
	inv.t = newTracker(retention)

	inv.loadMu.Lock()
	defer inv.loadMu.Unlock()
	if err := inv.loadLocked(context.Background(), false); err != nil {
		return nil, err
	}
	return inv, nil
}

// Ready is closed from the start: NewInventory has loaded the file.
func (inv *Inventory) Ready() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Run checks the file every interval until ctx is done, then returns nil.
// A change is loaded once the file has stayed the same for one interval, so
// that a file being written is not read half-way. Run also forgets deleted
// objects whose retention has passed. Load failures are logged and counted
// (see Stats), never returned.
func (inv *Inventory) Run(ctx context.Context) error {
	tick := time.NewTicker(inv.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			inv.poll(ctx)
		}
	}
}

// Reload reads the file now, whether or not it seems to have changed, and
// forgets deleted objects whose retention has passed. On failure the
// previous data stays in use; the failure is logged, counted and returned.
func (inv *Inventory) Reload(ctx context.Context) error {
	inv.t.expire(inv.now())
	inv.loadMu.Lock()
	defer inv.loadMu.Unlock()
	inv.pending = nil
	return inv.loadLocked(ctx, true)
}

// Stats returns the load counters and the size of the current data.
func (inv *Inventory) Stats() InventoryStats {
	s := inv.t.snapshot()
	inv.statsMu.Lock()
	st := inv.stats
	inv.statsMu.Unlock()
	st.Pods, st.DeletedPods = s.livePods, s.deletedPods
	st.Nodes, st.Services = len(s.nodes), len(s.services)
	return st
}

// PodByIP implements Store.
func (inv *Inventory) PodByIP(ip netip.Addr, at time.Time) (*Pod, bool) {
	return inv.t.snapshot().podByIP(ip, at)
}

// NodeByName implements Store.
func (inv *Inventory) NodeByName(name string) (*Node, bool) {
	return inv.t.snapshot().nodeByName(name)
}

// ServiceByName implements Store.
func (inv *Inventory) ServiceByName(namespace, name string) (*Service, bool) {
	return inv.t.snapshot().serviceByName(namespace, name)
}

// ServiceByClusterIP implements Store.
func (inv *Inventory) ServiceByClusterIP(ip netip.Addr) (*Service, bool) {
	return inv.t.snapshot().serviceByClusterIP(ip)
}

func (inv *Inventory) poll(ctx context.Context) {
	inv.t.expire(inv.now())

	inv.loadMu.Lock()
	defer inv.loadMu.Unlock()
	fi, err := os.Stat(inv.path)
	if err != nil {
		// Report a lasting failure once; load the file again when it is back.
		if msg := err.Error(); msg != inv.statErr {
			inv.statErr = msg
			inv.failed(ctx, fmt.Errorf("inventory: %w", err))
		}
		inv.attempted, inv.pending = nil, nil
		return
	}
	inv.statErr = ""
	if sameFileState(fi, inv.attempted) {
		return
	}
	if !sameFileState(fi, inv.pending) {
		inv.pending = fi
		return
	}
	inv.pending = nil
	_ = inv.loadLocked(ctx, true) // logged and counted
}

// loadLocked reads, parses and applies the file. Content identical to the
// last loaded content is not parsed again. Failures are counted and, when
// reload is set, logged.
func (inv *Inventory) loadLocked(ctx context.Context, reload bool) error {
	fail := func(err error) error {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return err // cancelled: not a problem with the file
		}
		if reload {
			inv.failed(ctx, err)
		}
		return err
	}
	fi, err := os.Stat(inv.path)
	if err != nil {
		return fail(fmt.Errorf("inventory: %w", err))
	}
	inv.attempted = fi
	data, err := os.ReadFile(inv.path)
	if err != nil {
		return fail(fmt.Errorf("inventory: %w", err))
	}
	sum := sha256.Sum256(data)
	if reload && sum == inv.loadedHash {
		inv.clearError()
		return nil
	}
	c, err := parseInventory(ctx, data)
	if err != nil {
		return fail(fmt.Errorf("inventory %s: %w", inv.path, err))
	}
	now := inv.now()
	inv.t.update(now, func(tx *txn) { tx.replaceAll(c.pods, c.nodes, c.services) })
	inv.loadedHash = sum

	inv.statsMu.Lock()
	inv.stats.Loads++
	inv.stats.LastLoad = now
	inv.stats.LastError = ""
	inv.stats.HostNetworkPods = c.hostNetworkPods
	inv.stats.Ignored = c.ignored
	inv.statsMu.Unlock()

	s := inv.t.snapshot()
	inv.log.InfoContext(ctx, "inventory loaded", "path", inv.path,
		"pods", s.livePods, "deletedPods", s.deletedPods,
		"nodes", len(s.nodes), "services", len(s.services),
		"hostNetworkPods", c.hostNetworkPods, "ignored", c.ignored)
	return nil
}

func (inv *Inventory) failed(ctx context.Context, err error) {
	inv.statsMu.Lock()
	inv.stats.LoadErrors++
	inv.stats.LastError = err.Error()
	inv.statsMu.Unlock()
	inv.log.ErrorContext(ctx, "inventory reload failed, keeping the previous data",
		"path", inv.path, "error", err)
}

func (inv *Inventory) clearError() {
	inv.statsMu.Lock()
	inv.stats.LastError = ""
	inv.statsMu.Unlock()
}

// sameFileState reports whether a and b describe the same file with the same
// size and modification time.
func sameFileState(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) &&
		a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
