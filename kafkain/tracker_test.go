package kafkain

import (
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func commitAt(t *testing.T, tr *tracker, p int32) int64 {
	t.Helper()
	tr.expire(tr.now().Add(-tr.horizon))
	c, ok := tr.commitable()[p]
	if !ok {
		return -2
	}
	tr.committedAt(p, c[0], c[1])
	return c[0]
}

func TestTrackerCommitsUpToTheOldestUnexported(t *testing.T) {
	ck := &clock{time.Unix(1000, 0)}
	tr := newTracker(true, time.Minute, ck.now)
	tr.assign(0, -1, -1)
	a, _, _ := tr.fetched("a", 0, 0)
	b, _, _ := tr.fetched("b", 0, 1)
	if got := commitAt(t, tr, 0); got != 0 {
		t.Fatalf("commit %d before anything was exported, want 0 (the oldest record held)", got)
	}
	// An export before the mode took the record does not count.
	tr.exported("a", 100)
	if got := commitAt(t, tr, 0); got != -2 {
		t.Fatalf("commit moved to %d on an export from before the record was taken", got)
	}
	tr.resolved([]*part{a, b}, 7, map[int32]int64{0: 2})
	// Nor does an export built before the record was added.
	tr.exported("a", 6)
	if got := commitAt(t, tr, 0); got != -2 {
		t.Fatalf("commit moved to %d on an export at a position before the record's", got)
	}
	tr.exported("a", 7)
	if got := commitAt(t, tr, 0); got != 1 {
		t.Fatalf("commit at %d once a was exported, want 1 (b still held)", got)
	}
	// A later record of a flow exported already opens a new part.
	a2, _, _ := tr.fetched("a", 0, 2)
	tr.resolved([]*part{a2}, 9, map[int32]int64{0: 3})
	tr.exported("b", 9)
	if got := commitAt(t, tr, 0); got != 2 {
		t.Fatalf("commit at %d, want 2 (a's new record held)", got)
	}
	// Past the horizon, a flow that exported nothing more stops holding.
	ck.t = ck.t.Add(2 * time.Minute)
	if got := commitAt(t, tr, 0); got != 3 {
		t.Fatalf("commit at %d past the horizon, want 3", got)
	}
	if n := tr.live(); n != 0 {
		t.Errorf("%d flows still tracked", n)
	}
}

func TestTrackerReplayAndHandOver(t *testing.T) {
	ck := &clock{time.Unix(1000, 0)}
	tr := newTracker(true, time.Minute, ck.now)
	// The previous owner committed 10 and had read up to 15.
	tr.assign(3, 10, 15)
	if _, replay, owned := tr.fetched("x", 3, 12); !replay || !owned {
		t.Errorf("offset 12 < 15: replay %v owned %v, want a replay", replay, owned)
	}
	if _, replay, _ := tr.fetched("y", 3, 15); replay {
		t.Error("offset 15 counted as a replay")
	}
	if _, _, owned := tr.fetched("z", 4, 0); owned {
		t.Error("a record of a partition not assigned was taken")
	}
	tr.leave([]int32{3})
	if _, _, owned := tr.fetched("w", 3, 16); owned {
		t.Error("a record of a leaving partition was taken")
	}
	keys := tr.revoke([]int32{3})
	if len(keys) != 2 || !keys["x"] || !keys["y"] {
		t.Errorf("handed over %v, want x and y", keys)
	}
	if _, ok := tr.commitable()[3]; ok {
		t.Error("a revoked partition is still committed")
	}
}

func TestTrackerStateless(t *testing.T) {
	tr := newTracker(false, 0, time.Now)
	tr.assign(0, 5, -1)
	if pt, _, owned := tr.fetched("a", 0, 5); pt != nil || !owned {
		t.Fatalf("stateless: part %v owned %v", pt, owned)
	}
	// Before the batch is written the commit does not move; it is
	// refreshed once for the metadata (the offset read up to).
	if got := commitAt(t, tr, 0); got != 5 {
		t.Fatalf("commit at %d before the batch was written, want 5", got)
	}
	if got := commitAt(t, tr, 0); got != -2 {
		t.Fatalf("commit again at %d with nothing new", got)
	}
	tr.resolved(nil, 0, map[int32]int64{0: 6})
	if got := commitAt(t, tr, 0); got != 6 {
		t.Fatalf("commit at %d once written, want 6", got)
	}
}

// The horizon runs from when the mode took a record, not from its fetch:
// a record that waited in the pipeline longer than the horizon must not
// expire the moment it is taken, before the store could export it.
func TestTrackerHorizonFromResolve(t *testing.T) {
	ck := &clock{time.Unix(1000, 0)}
	tr := newTracker(true, time.Minute, ck.now)
	tr.assign(0, -1, -1)
	a, _, _ := tr.fetched("a", 0, 0)
	ck.t = ck.t.Add(2 * time.Minute) // the mode was behind
	tr.resolved([]*part{a}, 1, map[int32]int64{0: 1})
	ck.t = ck.t.Add(time.Second)
	if got := commitAt(t, tr, 0); got != 0 {
		t.Fatalf("commit at %d one second after the mode took the record, want 0 (held)", got)
	}
	ck.t = ck.t.Add(time.Minute)
	if got := commitAt(t, tr, 0); got != 1 {
		t.Fatalf("commit at %d a horizon after the mode took the record, want 1", got)
	}
}

// A partition that comes back to this member (lost with its session,
// say) counts as replays what the member itself read before, even past
// its last commit's metadata.
func TestTrackerOwnReadsReplayed(t *testing.T) {
	tr := newTracker(true, time.Minute, time.Now)
	tr.assign(0, 0, -1)
	for o := range int64(5) {
		tr.fetched("a", 0, o)
	}
	tr.revoke([]int32{0})
	tr.assign(0, 0, 2) // the last commit's metadata: read up to 2
	if _, replay, _ := tr.fetched("a", 0, 3); !replay {
		t.Error("offset 3, read by this member before, not counted as a replay")
	}
	if _, replay, _ := tr.fetched("a", 0, 5); replay {
		t.Error("offset 5, never read, counted as a replay")
	}
}

// A long-lived flow whose records keep coming: a record taken between an
// export and the commit that applies it must not keep the flow's older
// records held. The export releases what it covers.
func TestTrackerBusyFlowReleasedByEachExport(t *testing.T) {
	tr := newTracker(true, time.Hour, time.Now)
	tr.assign(0, -1, -1)
	a, _, _ := tr.fetched("a", 0, 0)
	tr.resolved([]*part{a}, 5, map[int32]int64{0: 1})
	// The store exports the flow at position 5; before the input applies
	// the export, the flow's next record is taken (at position 6).
	a, _, _ = tr.fetched("a", 0, 1)
	tr.resolved([]*part{a}, 6, map[int32]int64{0: 2})
	tr.exported("a", 5)
	if got := commitAt(t, tr, 0); got != 1 {
		t.Fatalf("commit at %d, want 1: the export at 5 covers the record at 0, only the one at 1 is held", got)
	}
	// Again, with a record still pending when the export is applied.
	a, _, _ = tr.fetched("a", 0, 2)
	tr.exported("a", 6)
	if got := commitAt(t, tr, 0); got != 2 {
		t.Fatalf("commit at %d, want 2 (the pending record)", got)
	}
	tr.resolved([]*part{a}, 9, map[int32]int64{0: 3})
	tr.exported("a", 9)
	if got := commitAt(t, tr, 0); got != 3 {
		t.Fatalf("commit at %d once everything was exported, want 3", got)
	}
	if n := tr.live(); n != 0 {
		t.Errorf("%d flows held", n)
	}
}
