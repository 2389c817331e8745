package exporter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"sluice/enrich"
	"sluice/exporter/collectoraddr"
)

// resolver returns the address to dial for c: host:port, with a Service
// looked up in store at each call so a changed ClusterIP is followed.
func resolver(c collectoraddr.Collector, store enrich.Store) func(ctx context.Context) (string, error) {
	ns, name, isSvc := c.ServiceRef()
	port := strconv.Itoa(int(c.Port))
	return func(context.Context) (string, error) {
		if !isSvc {
			return net.JoinHostPort(c.Host, port), nil
		}
		if store == nil {
			return "", errors.New("the collector address names a Service, but there is no metadata source (--in-cluster, --kubeconfig or --inventory) to look it up")
		}
		svc, ok := store.ServiceByName(ns, name)
		if !ok || len(svc.ClusterIPs) == 0 {
			return "", fmt.Errorf("the Service %s/%s is unknown or has no ClusterIP", ns, name)
		}
		return net.JoinHostPort(svc.ClusterIPs[0].String(), port), nil
	}
}
