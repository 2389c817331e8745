// Package mode is the contract between the aggregator and its modes
// (Aggregate, Proxy): what a mode reads, what it writes, and the optional
// fast path by which a mode hands records to an IPFIX sink already encoded.
// It lives below the modes and the aggregator so that neither imports the
// other's types.
package mode

import (
	"context"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/ring"
)

// A Mode turns the collectors' batches into records for the sinks.
type Mode interface {
	// Run reads batches from in until in is closed, then hands on what it
	// still holds and returns; it returns at once when ctx ends.
	Run(ctx context.Context, in <-chan flow.Batch, out *ring.Buffer[*flow.Flow])
}

// An Encoder is a Mode that can also produce export records already
// encoded, for an aggregator whose only sink sends IPFIX (Proxy mode's fast
// path).
type Encoder interface {
	Mode
	// Encoded prepares that path for records exported with ex. It returns
	// nil (and no error) when no record could take it with the mode's
	// settings.
	Encoded(table *ipfixmap.Table, ex *ipfixmap.Exporter) (Encoded, error)
}

// Encoded is a mode's encoded path, once prepared.
type Encoded interface {
	// NewForwarder returns the forwarder of one collector session: the
	// collectors turn what records they can into export records with it.
	NewForwarder() flow.Forwarder
	// Run is Mode.Run for batches whose records are partly encoded: it
	// writes export records only. encodeErr hears of each record that
	// cannot be written (it is dropped).
	Run(ctx context.Context, in <-chan flow.Batch, out *ring.Buffer[ipfix.EncodedRecord], encodeErr func(error))
	// Sample makes Run and the forwarders give buf a sample of the records
	// (at most perSecond a second, enriched as exported), which otherwise
	// never become flow records; the returned Sampler is the collectors'.
	// Call it before Run.
	Sample(buf *ring.Buffer[*flow.Flow], perSecond int) flow.Sampler
}
