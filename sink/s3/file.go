package s3

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"

	"sluice/flow"
)

// Formats of Options.Format.
const (
	FormatCSV     = "CSV"
	FormatParquet = "Parquet"
)

// rowGroupRows is how many rows a Parquet row group holds at most: it
// bounds what the writer keeps in column buffers before encoding them.
const rowGroupRows = 65536

// encoder builds the content of one object in memory.
type encoder interface {
	// add appends a record; written is the upload-side timestamp.
	add(f *flow.Flow, written time.Time) error
	// finish completes the object and returns its octets; the encoder is
	// not used again.
	finish() ([]byte, error)
	// size is the number of octets produced so far (an estimate for
	// Parquet, whose current row group is still in column buffers).
	size() int
}

// format describes the objects of one record format.
type format struct {
	ext         string // ".csv", ".csv.gz", ".parquet"
	contentType string
	newEncoder  func() encoder
}

// newFormat is the file format name; cluster, when not empty, fills every
// row's clusterUUID.
func newFormat(name string, compress bool, cluster string) (format, error) {
	switch name {
	case FormatCSV, "":
		if compress {
			return format{ext: ".csv.gz", contentType: "application/gzip",
				newEncoder: func() encoder { return newCSVEncoder(true, cluster) }}, nil
		}
		return format{ext: ".csv", contentType: "text/csv",
			newEncoder: func() encoder { return newCSVEncoder(false, cluster) }}, nil
	case FormatParquet:
		return format{ext: ".parquet", contentType: "application/vnd.apache.parquet",
			newEncoder: func() encoder { return newParquetEncoder(compress, cluster) }}, nil
	}
	return format{}, fmt.Errorf("record format %q is not CSV or Parquet", name)
}

// csvEncoder writes rows, gzipped or not, into a buffer.
type csvEncoder struct {
	buf  bytes.Buffer
	gz   *gzip.Writer
	line []byte
	// cluster, when not empty, is the clusterUUID field of every row
	// (Options.ClusterUUID); else each record's clusterId.
	cluster string
}

func newCSVEncoder(compress bool, cluster string) *csvEncoder {
	e := &csvEncoder{line: make([]byte, 0, 1024), cluster: cluster}
	if compress {
		e.gz = gzip.NewWriter(&e.buf)
	}
	return e
}

func (e *csvEncoder) add(f *flow.Flow, written time.Time) error {
	cluster := e.cluster
	if cluster == "" {
		cluster = f.ClusterID
	}
	e.line = appendCSVRow(e.line[:0], f, written, cluster)
	e.line = append(e.line, '\n')
	if e.gz != nil {
		_, err := e.gz.Write(e.line)
		return err
	}
	e.buf.Write(e.line)
	return nil
}

func (e *csvEncoder) finish() ([]byte, error) {
	if e.gz != nil {
		if err := e.gz.Close(); err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
	}
	return e.buf.Bytes(), nil
}

func (e *csvEncoder) size() int { return e.buf.Len() }

// parquetEncoder writes rows into a Parquet file in a buffer, a batch of
// rows at a time.
type parquetEncoder struct {
	buf   bytes.Buffer
	w     *parquet.GenericWriter[ParquetRow]
	batch []ParquetRow
	n     int
	addrs addrTexts
	// cluster: as csvEncoder's.
	cluster string
}

func newParquetEncoder(compress bool, cluster string) *parquetEncoder {
	e := &parquetEncoder{batch: make([]ParquetRow, 0, 512), cluster: cluster, addrs: addrTexts{}}
	opts := []parquet.WriterOption{parquet.MaxRowsPerRowGroup(rowGroupRows),
		parquet.CreatedBy("sluice", "", "")}
	if compress {
		opts = append(opts, parquet.Compression(&zstd.Codec{Level: zstd.DefaultLevel}))
	}
	e.w = parquet.NewGenericWriter[ParquetRow](&e.buf, opts...)
	return e
}

func (e *parquetEncoder) add(f *flow.Flow, written time.Time) error {
	e.batch = e.batch[:len(e.batch)+1]
	r := &e.batch[len(e.batch)-1]
	makeParquetRow(r, f, written, e.addrs)
	if e.cluster != "" {
		r.ClusterUUID = e.cluster
	}
	e.n++
	if len(e.batch) == cap(e.batch) {
		return e.flush()
	}
	return nil
}

func (e *parquetEncoder) flush() error {
	if len(e.batch) == 0 {
		return nil
	}
	_, err := e.w.Write(e.batch)
	clear(e.batch)
	e.batch = e.batch[:0]
	if err != nil {
		return fmt.Errorf("parquet: %w", err)
	}
	return nil
}

func (e *parquetEncoder) finish() ([]byte, error) {
	if err := e.flush(); err != nil {
		return nil, err
	}
	if err := e.w.Close(); err != nil {
		return nil, fmt.Errorf("parquet: %w", err)
	}
	return e.buf.Bytes(), nil
}

func (e *parquetEncoder) size() int { return e.buf.Len() }
