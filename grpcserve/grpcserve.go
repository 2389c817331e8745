// Package grpcserve runs a gRPC server for the length of a context: the
// lifecycle the aggregator's gRPC collector and its flow stream service
// share.
package grpcserve

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc"
)

// Serve serves srv on ln until ctx ends, then stops it gracefully,
// closing its connections if that takes longer than stopTimeout (forced,
// if not nil, is called then). It returns once Serve has. If Serve fails
// first, the connections it accepted are closed (their handlers waited
// for, with grpc.WaitForHandlers) before the error is returned, so that
// no handler outlives the call.
func Serve(ctx context.Context, srv *grpc.Server, ln net.Listener, stopTimeout time.Duration, forced func()) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		srv.Stop()
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopTimeout):
		if forced != nil {
			forced()
		}
		srv.Stop()
		<-stopped
	}
	<-served
	return nil
}
