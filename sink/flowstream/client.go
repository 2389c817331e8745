package flowstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"sluice/flow/flowpb"
)

// Get calls GetFlows on the service at addr (host:port) and hands each
// response to fn until the stream ends (nil), fn fails or ctx ends.
func Get(ctx context.Context, addr string, tlsConf *tls.Config, req *flowpb.GetFlowsRequest, fn func(*flowpb.GetFlowsResponse) error) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsConf)))
	if err != nil {
		return fmt.Errorf("flow stream %s: %w", addr, err)
	}
	defer conn.Close()
	st, err := flowpb.NewFlowStreamServiceClient(conn).GetFlows(ctx, req)
	if err != nil {
		return fmt.Errorf("flow stream %s: %w", addr, err)
	}
	for {
		resp, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("flow stream %s: %w", addr, err)
		}
		if err := fn(resp); err != nil {
			return err
		}
	}
}
