package demo

import (
	"context"
	"net/netip"

	"sluice/exporter/source"
)

// nodeView is one Node's connection table, cut from the table of the
// whole cluster: the same connection must reach the exporters of both its
// Nodes for the aggregator to correlate them.
type nodeView struct {
	cluster source.Source
	local   []netip.Prefix
	scratch []source.Conn
}

func (v *nodeView) isLocal(a netip.Addr) bool {
	for _, p := range v.local {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Dump appends the connections with a local Pod at either end. The
// server's Node never sees a Service's ClusterIP: the client's Node
// translated it before the packet left, so there the original
// destination is already the endpoint. A connection a policy denied is
// only in the client's table.
func (v *nodeView) Dump(ctx context.Context, dst []source.Conn) ([]source.Conn, error) {
	var err error
	if v.scratch, err = v.cluster.Dump(ctx, v.scratch[:0]); err != nil {
		return dst, err
	}
	for _, c := range v.scratch {
		client, server := v.isLocal(c.OrigSrc.Addr()), v.isLocal(c.ReplySrc.Addr())
		if !client && !server {
			continue
		}
		if !client {
			if c.ReversePackets == 0 {
				// Unanswered: the server's Node dropped it (a policy)
				// before committing it, so it never entered its table.
				continue
			}
			c.OrigDst = c.ReplySrc
		}
		dst = append(dst, c)
	}
	return dst, nil
}

// Close leaves the cluster's table open: the demo closes it once every
// exporter is done.
func (v *nodeView) Close() error { return nil }
