package s3

import (
	"fmt"
	"net/url"

	"sluice/config"
	"sluice/sink"
)

// Factory is the s3Uploader sink. It runs in both modes: in Proxy mode a
// row is one record as received and enriched, with the per-node columns
// (end times and throughputs from each Node) left 0.
func Factory() sink.Factory {
	return sink.Factory{Key: config.SinkS3Uploader, Proxy: true, New: newFromConfig}
}

func newFromConfig(env sink.Env) (sink.Sink, error) {
	cfg := env.Config
	c := cfg.S3Uploader
	o := Options{Bucket: c.BucketName, Prefix: c.BucketPrefix, Region: c.Region, Format: c.RecordFormat,
		Compress: c.Compress, MaxRecordsPerFile: c.MaxRecordsPerFile, UploadInterval: c.UploadInterval.Duration,
		Log: env.Log, Metrics: env.Metrics, Registry: env.Registry, Name: config.SinkS3Uploader, ClusterUUID: env.ClusterUUIDText()}
	if c.Endpoint != "" {
		host, secure, err := ParseEndpoint(c.Endpoint)
		if err != nil {
			return nil, cfg.KeyError("s3Uploader.endpoint", err)
		}
		o.Endpoint, o.Secure = host, secure
	}
	s, err := New(o)
	if err != nil {
		return nil, cfg.KeyError("s3Uploader.enable", err)
	}
	return s, nil
}

// ParseEndpoint reads s3Uploader.endpoint, http://host[:port] or
// https://host[:port], into the host and whether it is HTTPS.
func ParseEndpoint(s string) (host string, secure bool, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", false, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return "", false, fmt.Errorf("%q is not http://<host>[:<port>] or https://<host>[:<port>]", s)
	}
	return u.Host, u.Scheme == "https", nil
}
