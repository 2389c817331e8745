// Package flowjson renders flow records as JSON objects keyed by IPFIX
// element names, with the elements and values the IPFIX export would
// carry: each record goes through the exporter's template and the codec,
// so the JSON and IPFIX forms can never disagree.
package flowjson

import (
	"errors"
	"fmt"
	"time"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/ipfix/ipfixjson"
)

// Renderer turns records into JSON. It is not safe for concurrent use.
type Renderer struct {
	ex  *ipfixmap.Exporter
	enc *ipfix.Encoder
	msg []byte
	dec *ipfix.Decoder
}

// New returns a renderer using ex's templates and element order.
func New(ex *ipfixmap.Exporter) *Renderer {
	r := &Renderer{ex: ex, dec: ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))}
	// The encoder only fails on bad options; these are the defaults.
	r.enc, _ = ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { r.msg = m; return nil })
	return r
}

// AppendFields appends f's "name":value members, without braces.
func (r *Renderer) AppendFields(b []byte, f *flow.Flow) ([]byte, error) {
	t, _, err := r.ex.Template(f)
	if err != nil {
		return b, fmt.Errorf("flowjson: %w", err)
	}
	if err := r.enc.AddTemplate(0, t); err != nil {
		return b, fmt.Errorf("flowjson: %w", err)
	}
	if err := r.ex.Write(r.enc.Begin(0, t), t, f); err != nil {
		r.enc.Discard()
		return b, fmt.Errorf("flowjson: %w", err)
	}
	if err := r.enc.Flush(); err != nil {
		return b, fmt.Errorf("flowjson: %w", err)
	}
	if err := r.dec.Reset(r.msg, time.Time{}); err != nil {
		return b, fmt.Errorf("flowjson: %w", err)
	}
	if !r.dec.Next() {
		if err := r.dec.Err(); err != nil {
			return b, fmt.Errorf("flowjson: %w", err)
		}
		return b, errors.New("flowjson: the encoded record did not decode")
	}
	return ipfixjson.AppendFields(b, r.dec.Record()), nil
}

// AppendObject appends f as one JSON object.
func (r *Renderer) AppendObject(b []byte, f *flow.Flow) ([]byte, error) {
	n := len(b)
	b = append(b, '{')
	b, err := r.AppendFields(b, f)
	if err != nil {
		return b[:n], err
	}
	return append(b, '}'), nil
}
