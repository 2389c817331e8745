package aggregator_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"sluice/aggregator"
	"sluice/config"
)

// The Traceflow controller needs Kubernetes: without a kubeconfig and
// outside a Pod, New refuses sluice.traceflow.enable and says why.
func TestTraceflowNeedsKubernetes(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	cfg := config.Default()
	cfg.Sluice.IPFIXAddress, cfg.Sluice.GRPCAddress, cfg.Sluice.APIAddress = "127.0.0.1:0", "", "127.0.0.1:0"
	cfg.Sluice.FlowStreamAddress = "127.0.0.1:0"
	cfg.AggregatorTransportProtocol = config.TransportTCP
	cfg.Sluice.Traceflow.Enable = true
	_, err := aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "sluice.traceflow.enable") || !strings.Contains(err.Error(), "needs Kubernetes") {
		t.Errorf("New: %v", err)
	}
}
