package aggregator

import (
	"context"
	"net"
	"sync"

	"sluice/certs"
	"sluice/collector"
	"sluice/config"
	"sluice/flow"
)

// setupCollectors binds the IPFIX listener of aggregatorTransportProtocol
// and the gRPC one.
func (a *Aggregator) setupCollectors() error {
	cfg := a.cfg
	o := collector.Options{Table: a.table, Out: a.batches, Log: a.log, Metrics: collector.NewMetrics(a.reg)}
	if a.encoded != nil {
		o.Forwarder = a.encoded.NewForwarder
		o.Sample = a.sample
	}
	// Aggregate mode copies what it keeps of each record and gives the
	// records back; so does Proxy mode's fast path, which writes them out
	// as octets (proxy.Forwarding.Run); otherwise Proxy mode hands them
	// on to the sinks.
	if _, ok := a.mode.(aggregateMode); ok || a.encoded != nil {
		o.Records = flow.NewPool()
	}
	// Proxy mode forwards at once, so a gRPC stream can be confirmed
	// once its records are written on: a killed aggregator then loses
	// nothing it confirmed. Aggregate mode holds records for correlation
	// by design and confirms them once taken.
	o.GRPC.ConfirmWritten = cfg.Mode == config.ModeProxy
	var err error
	a.coll, err = collector.New(o)
	if err != nil {
		return err
	}
	// The gRPC collector runs, with mutual TLS, beside the IPFIX one
	// unless sluice.grpcAddress is set empty.
	if cfg.Sluice.GRPCAddress != "" {
		bundle, err := a.serverCerts()
		if err != nil {
			return err
		}
		a.grpcTLS = a.collectorTLS(bundle, "h2")
		if a.grpcLn, err = net.Listen("tcp", cfg.Sluice.GRPCAddress); err != nil {
			return cfg.KeyError("sluice.grpcAddress", err)
		}
	}
	switch cfg.AggregatorTransportProtocol {
	case config.TransportNone:
		return nil
	case config.TransportUDP:
		ua, err := net.ResolveUDPAddr("udp", cfg.Sluice.IPFIXAddress)
		if err != nil {
			return cfg.KeyError("sluice.ipfixAddress", err)
		}
		if a.udpConn, err = net.ListenUDP("udp", ua); err != nil {
			return cfg.KeyError("sluice.ipfixAddress", err)
		}
		return nil
	case config.TransportTLS:
		bundle, err := a.serverCerts()
		if err != nil {
			return err
		}
		a.tlsConf = a.collectorTLS(bundle)
	}
	if a.tcpLn, err = net.Listen("tcp", cfg.Sluice.IPFIXAddress); err != nil {
		return cfg.KeyError("sluice.ipfixAddress", err)
	}
	return nil
}

// startCollectors serves each bound listener until ctx ends; a listener's
// failure goes to errs. The group ends when all have stopped.
func (a *Aggregator) startCollectors(ctx context.Context, errs chan<- error) *sync.WaitGroup {
	var colls sync.WaitGroup
	start := func(f func() error) {
		colls.Go(func() {
			if err := f(); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	if a.tcpLn != nil {
		start(func() error { return a.coll.ServeTCP(ctx, a.tcpLn, a.tlsConf) })
	}
	if a.udpConn != nil {
		start(func() error { return a.coll.ServeUDP(ctx, a.udpConn) })
	}
	if a.grpcLn != nil {
		start(func() error { return a.coll.ServeGRPC(ctx, a.grpcLn, a.grpcTLS) })
	}
	if a.kin != nil {
		start(func() error { return a.kin.Run(ctx) })
	}
	return &colls
}

// serverCerts loads the collectors' certificates from files, or makes
// (once) and reuses a CA and certificates in the certificate directory.
func (a *Aggregator) serverCerts() (*certs.Bundle, error) {
	if a.certs != nil {
		return a.certs, nil
	}
	b, err := a.loadServerCerts()
	if err != nil {
		return nil, err
	}
	a.certs = b
	if a.certReloader, err = a.reloadingServerCerts(b); err != nil {
		return nil, a.cfg.KeyError("sluice.tls.reloadInterval", err)
	}
	return b, nil
}

func (a *Aggregator) loadServerCerts() (*certs.Bundle, error) {
	t := a.cfg.Sluice.TLS
	if !t.Generated() {
		b, err := certs.Load(t.CertFile, t.KeyFile, t.CAFile)
		if err != nil {
			return nil, a.cfg.KeyError("sluice.tls.certFile", err)
		}
		return b, nil
	}
	dir, err := t.CertDirectory()
	if err != nil {
		return nil, a.cfg.KeyError("sluice.tls.certDir", err)
	}
	var names []string
	if a.cfg.FlowAggregatorAddress != "" {
		names = append(names, a.cfg.FlowAggregatorAddress)
	}
	publish, err := a.restoreClusterCerts(dir)
	if err != nil {
		return nil, a.cfg.KeyError("sluice.tls.certDir", err)
	}
	b, err := certs.Ensure(dir, certs.Options{ServerNames: names})
	if err != nil {
		return nil, a.cfg.KeyError("sluice.tls.certDir", err)
	}
	if err := publish(); err != nil {
		return nil, a.cfg.KeyError("sluice.tls.certDir", err)
	}
	if len(b.Issued) > 0 {
		a.log.Info("issued TLS certificates; point exporters at the CA", "dir", dir, "issued", b.Issued, "ca", b.Paths.CACert)
	}
	return b, nil
}
