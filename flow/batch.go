package flow

import (
	"context"

	"sluice/ipfix"
)

// Batch is what a collector hands to the aggregator's mode: the records of
// one message. It lives here, below both, so that the modes need not
// import the collectors.
type Batch struct {
	Flows []*Flow
	// Encoded are records a Forwarder already turned into export records
	// (Proxy mode's fast path); they are not in Flows.
	Encoded []ipfix.EncodedRecord
	// Rebuilt is how many of Encoded a FlowForwarder wrote from flow
	// records (the others were copied from received records), and
	// EncodeErrs the errors of the flow records it enriched but could not
	// write (dropped): the mode counts and reports both.
	Rebuilt    int
	EncodeErrs []error
	// Written, when set, asks the mode for a way to wait until the sinks
	// have written every record handed on before this batch (a gRPC
	// stream confirms its records only then). The mode sends exactly one
	// function on it (buffered) when it reaches the batch; the function
	// blocks until then or until its context ends. A mode that holds
	// records back by design (Aggregate) sends one that returns at once.
	Written chan<- func(context.Context) error
	// Pool, when set, takes Flows back once the mode has finished with
	// them (Release).
	Pool *Pool
}

// Release gives the batch's records back to its Pool, if it has one: a mode
// calls it once it no longer uses them, nor has handed any of them on.
func (b *Batch) Release() {
	if b.Pool == nil {
		return
	}
	b.Pool.PutAll(b.Flows)
	b.Flows = nil
}

// Resolve answers a batch's Written request, if it has one, with wait.
func (b *Batch) Resolve(wait func(context.Context) error) {
	if b.Written != nil {
		b.Written <- wait
	}
}

// Now is a wait that is over at once.
func Now(context.Context) error { return nil }

// Len is the number of records in the batch.
func (b *Batch) Len() int { return len(b.Flows) + len(b.Encoded) }

// A Forwarder turns decoded IPFIX data records straight into export
// records, without a flow record in between: Proxy mode's fast path, for
// records whose export is their own fields plus a few more. Each collector
// session has its own, used from that session's goroutine.
type Forwarder interface {
	// Forward appends r, as an export record, to out, with its octets
	// appended to arena (out's records may alias arena's earlier backing
	// arrays), and reports true. On false, r is normalized into a flow
	// record instead, and arena and out are returned unchanged.
	Forward(r *ipfix.Record, o *Origin, arena []byte, out []ipfix.EncodedRecord) ([]byte, []ipfix.EncodedRecord, bool)
}

// A FlowForwarder is a Forwarder that also turns flow records (the gRPC
// collector's) into export records on the collector's goroutine, while
// each is still in that core's caches: the fast path for records that
// arrive decoded into flow records rather than as IPFIX octets.
type FlowForwarder interface {
	Forwarder
	// ForwardFlow enriches f as the mode would, appends it as an export
	// record to out, with its octets appended to arena, and reports true:
	// f is then the caller's again, to reuse. A non-nil error says that f
	// was enriched but could not be written: it is dropped, and the error
	// goes to the mode in a Batch's EncodeErrs. On false, f is unchanged
	// and goes the normal way, in a Batch's Flows; arena and out are
	// returned unchanged.
	ForwardFlow(f *Flow, arena []byte, out []ipfix.EncodedRecord) ([]byte, []ipfix.EncodedRecord, bool, error)
	// Takes reports whether ForwardFlow takes f (f is left as it is): a
	// cheap look, for a caller that must decide something first.
	Takes(f *Flow) bool
	// Release gives back what the forwarder holds (its encoder); it is
	// not used afterwards.
	Release()
}

// Discard gives back the arenas of a batch's encoded records when the
// batch is not handed on, so that they are reused rather than collected
// (under overload, when batches are dropped, allocating is the last thing
// wanted).
func (b *Batch) Discard() {
	ReleaseEncoded(b.Encoded)
}

// ReleaseEncoded releases the arenas of records that will not be sent:
// one Release per run of records in the same arena.
func ReleaseEncoded(recs []ipfix.EncodedRecord) {
	for i := 0; i < len(recs); {
		a, j := recs[i].Arena, i+1
		for j < len(recs) && recs[j].Arena == a {
			j++
		}
		if a != nil {
			a.Release(j - i)
		}
		i = j
	}
}

// Sampler takes a bounded sample of the records a fast path forwards
// without making flow records of them, for views of the export such as
// the web UI.
type Sampler interface {
	// Want reports whether to sample the next record; cheap and safe for
	// concurrent use.
	Want() bool
	// Put takes a sampled record (the caller gives it away), normalized
	// but not yet enriched.
	Put(f *Flow)
}
