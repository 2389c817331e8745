package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultServer is where the client looks for the aggregator's API.
const DefaultServer = "http://localhost:10348"

// maxResponse bounds what the client reads from the API.
const maxResponse = 2 << 30

// Client talks to an aggregator's HTTP API.
type Client struct {
	// Server is the API's base URL; "host:port" is taken as http.
	Server string
	HTTP   *http.Client
}

// FlowRecords is an answer of GET /flowrecords.
type FlowRecords struct {
	// Records are the flows, as element name → value.
	Records []map[string]any
	// Matches is how many flows the filters selected; more than
	// len(Records) when the limit cut the answer short.
	Matches int
}

func (c *Client) url(path string, q url.Values) (string, error) {
	base := c.Server
	if base == "" {
		base = DefaultServer
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("server %q: %w", c.Server, err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func (c *Client) get(ctx context.Context, path string, q url.Values) ([]byte, http.Header, error) {
	u, err := c.url(path, q)
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, err
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(b))
	}
	return b, resp.Header, nil
}

// FlowRecords asks for the flows the filters (srcip, dstip, proto,
// srcport, dstport, limit) select.
func (c *Client) FlowRecords(ctx context.Context, filters url.Values) (*FlowRecords, error) {
	b, h, err := c.get(ctx, "/flowrecords", filters)
	if err != nil {
		return nil, err
	}
	out := &FlowRecords{}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // keep 64-bit counters exact
	if err := d.Decode(&out.Records); err != nil {
		return nil, fmt.Errorf("flow records: %w", err)
	}
	out.Matches = len(out.Records)
	if n, err := strconv.Atoi(h.Get(HeaderMatches)); err == nil {
		out.Matches = n
	}
	return out, nil
}

// RecordMetrics asks for the aggregator's record counts.
func (c *Client) RecordMetrics(ctx context.Context) (*RecordMetrics, error) {
	b, _, err := c.get(ctx, "/recordmetrics", nil)
	if err != nil {
		return nil, err
	}
	var m RecordMetrics
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("record metrics: %w", err)
	}
	return &m, nil
}
