// Command kfakebroker runs franz-go's kfake, an in-memory Kafka cluster
// speaking the real wire protocol, as a process of its own: the tests of
// the kafka sink and input start it, kill it and start it again (no
// Apache Kafka can run where the tests run). It prints one line,
// "ADDRS host:port,host:port,...", once it listens, and serves until
// killed or until its standard input closes.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	brokers := flag.Int("brokers", 3, "number of brokers")
	partitions := flag.Int("partitions", 12, "partitions of each seeded topic")
	topics := flag.String("topics", "flows", "comma-separated topics to create")
	ports := flag.String("ports", "", "comma-separated ports, one per broker (default: any free port)")
	dataDir := flag.String("data", "", "directory that keeps the cluster's state across restarts (default: memory only)")
	sasl := flag.String("sasl", "", "user:password: require SASL, with this PLAIN and SCRAM-SHA-256/512 superuser")
	tlsPair := flag.String("tls", "", "cert.pem,key.pem: serve TLS with this pair")
	clientCA := flag.String("client-ca", "", "with -tls: require client certificates signed by this CA (PEM)")
	flag.Parse()

	opts := []kfake.Opt{kfake.NumBrokers(*brokers), kfake.SeedTopics(int32(*partitions), strings.Split(*topics, ",")...)}
	if *ports != "" {
		var ps []int
		for _, p := range strings.Split(*ports, ",") {
			n, err := strconv.Atoi(p)
			if err != nil {
				log.Fatalf("-ports: %v", err)
			}
			ps = append(ps, n)
		}
		opts = append(opts, kfake.Ports(ps...))
	}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir))
	}
	if *sasl != "" {
		user, pass, ok := strings.Cut(*sasl, ":")
		if !ok {
			log.Fatal("-sasl: want user:password")
		}
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser("PLAIN", user, pass),
			kfake.Superuser("SCRAM-SHA-256", user, pass), kfake.Superuser("SCRAM-SHA-512", user, pass))
	}
	if *tlsPair != "" {
		certFile, keyFile, _ := strings.Cut(*tlsPair, ",")
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			log.Fatalf("-tls: %v", err)
		}
		tc := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
		if *clientCA != "" {
			pem, err := os.ReadFile(*clientCA)
			if err != nil {
				log.Fatalf("-client-ca: %v", err)
			}
			tc.ClientCAs = x509.NewCertPool()
			tc.ClientCAs.AppendCertsFromPEM(pem)
			tc.ClientAuth = tls.RequireAndVerifyClientCert
		}
		opts = append(opts, kfake.TLS(tc))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		log.Fatalf("kfake: %v", err)
	}
	fmt.Printf("ADDRS %s\n", strings.Join(c.ListenAddrs(), ","))
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		close(done)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	select {
	case <-sig:
	case <-done:
	}
	c.Close()
}
