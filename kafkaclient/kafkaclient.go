// Package kafkaclient turns the Kafka keys of the configuration (brokers,
// TLS, SASL) into franz-go client options, for the kafka sink and the
// Kafka input alike. Every option it sets is valid for Apache Kafka 3.x
// and 4.x: the client negotiates protocol versions with ApiVersions.
package kafkaclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"sluice/config"
)

// Options returns the client options for brokers with t and s. Errors
// name the key at fault relative to its section (tls.caFile, say).
func Options(brokers []string, t config.KafkaTLS, s config.KafkaSASL) ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	if t.Enable {
		c, err := TLSConfig(t)
		if err != nil {
			return nil, err
		}
		// The client sets ServerName to each broker's host when c leaves
		// it empty.
		opts = append(opts, kgo.DialTLSConfig(c))
	}
	if s.Mechanism != "" {
		m, err := Mechanism(s)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// TLSConfig reads the CA and the client pair t names.
func TLSConfig(t config.KafkaTLS) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.caFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.caFile: %s holds no PEM certificate", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls.certFile/keyFile: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// Mechanism is the SASL mechanism s names. The password file is read at
// each authentication, so that a rotated Secret is used by the next
// connection.
func Mechanism(s config.KafkaSASL) (sasl.Mechanism, error) {
	password := func() (string, error) {
		if s.PasswordFile == "" {
			return s.Password, nil
		}
		b, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return "", fmt.Errorf("sasl.passwordFile: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	if _, err := password(); err != nil {
		return nil, err
	}
	switch s.Mechanism {
	case config.SASLPlain:
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			p, err := password()
			return plain.Auth{User: s.Username, Pass: p}, err
		}), nil
	case config.SASLScramSHA256, config.SASLScramSHA512:
		fn := func(context.Context) (scram.Auth, error) {
			p, err := password()
			return scram.Auth{User: s.Username, Pass: p}, err
		}
		if s.Mechanism == config.SASLScramSHA256 {
			return scram.Sha256(fn), nil
		}
		return scram.Sha512(fn), nil
	}
	return nil, fmt.Errorf("sasl.mechanism: %q is not a mechanism", s.Mechanism)
}

// IsShutdown reports whether err is a record's failure caused by the
// client closing or its context ending, rather than by the brokers.
func IsShutdown(err error) bool {
	return errors.Is(err, kgo.ErrClientClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
