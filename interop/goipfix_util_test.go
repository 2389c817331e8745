package interop

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/collector"
	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/registry"
	"k8s.io/klog/v2"

	"sluice/ipfix"
)

// loadGoIPFIXRegistry loads go-ipfix's global registry once, and silences
// klog, which go-ipfix logs through (to stderr by default, at Info level
// for every connection).
var loadGoIPFIXRegistry = sync.OnceFunc(func() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Parse([]string{"-logtostderr=false", "-alsologtostderr=false", "-stderrthreshold=FATAL"}); err != nil {
		panic(err)
	}
	klog.SetOutput(io.Discard)
	registry.LoadRegistry()
})

// goIPFIXLookup finds in go-ipfix's registry the element that Sluice's
// registry calls name, under the same enterprise number.
func goIPFIXLookup(reg *ipfix.Registry, name string) (*entities.InfoElement, error) {
	loadGoIPFIXRegistry()
	ours, ok := reg.ByName(name)
	if !ok {
		return nil, fmt.Errorf("sluice registry has no element %q", name)
	}
	ie, err := registry.GetInfoElement(name, ours.EnterpriseID)
	if err != nil {
		return nil, fmt.Errorf("go-ipfix registry: %w", err)
	}
	return ie, nil
}

// goIPFIXElement is goIPFIXLookup in the default registry for tests.
func goIPFIXElement(tb testing.TB, name string) *entities.InfoElement {
	tb.Helper()
	ie, err := goIPFIXLookup(ipfix.DefaultRegistry(), name)
	if err != nil {
		tb.Fatal(err)
	}
	return ie
}

// startGoIPFIXCollector starts a go-ipfix collecting process on a loopback
// port and stops it when the test ends.
func startGoIPFIXCollector(tb testing.TB, protocol string) *collector.CollectingProcess {
	tb.Helper()
	loadGoIPFIXRegistry()
	cp, err := collector.InitCollectingProcess(collector.CollectorInput{
		Address:  "127.0.0.1:0",
		Protocol: protocol,
		// The UDP collector reads datagrams into buffers of this size
		// (zero would read nothing); the TCP one ignores it.
		MaxBufferSize: ipfix.MaxMessageLen,
		DecodingMode:  collector.DecodingModeStrict,
	})
	if err != nil {
		tb.Fatal(err)
	}
	go cp.Start()
	deadline := time.Now().Add(5 * time.Second)
	for cp.GetAddress() == nil {
		if time.Now().After(deadline) {
			tb.Fatal("go-ipfix collector did not start listening")
		}
		time.Sleep(time.Millisecond)
	}
	tb.Cleanup(func() {
		// Stop waits for the connection goroutines, which may be
		// blocked handing a message over: keep draining meanwhile.
		go func() {
			for range cp.GetMsgChan() {
			}
		}()
		cp.Stop()
	})
	return cp
}

// sluiceValues materialises every field of a decoded record as the Go
// types antreaFlow.values uses.
func sluiceValues(r *ipfix.Record) ([]any, error) {
	vals := make([]any, r.NumFields())
	for i := range vals {
		var err error
		switch t := r.Field(i).Type; {
		case t.IsUnsigned():
			vals[i], err = r.Uint(i)
		case t == ipfix.String:
			vals[i], err = r.String(i)
		case t == ipfix.IPv4Address || t == ipfix.IPv6Address:
			vals[i], err = r.Addr(i)
		case t.IsTime():
			vals[i], err = r.Time(i)
		default:
			err = fmt.Errorf("field %d (%s): unexpected type %s", i, r.Field(i).Name(), t)
		}
		if err != nil {
			return nil, err
		}
	}
	return vals, nil
}

// goIPFIXValues materialises every element of a record decoded by
// go-ipfix as the Go types antreaFlow.values uses.
func goIPFIXValues(rec entities.Record) ([]any, error) {
	elems := rec.GetOrderedElementList()
	vals := make([]any, len(elems))
	for i, e := range elems {
		switch e.GetDataType() {
		case entities.Unsigned8:
			vals[i] = uint64(e.GetUnsigned8Value())
		case entities.Unsigned16:
			vals[i] = uint64(e.GetUnsigned16Value())
		case entities.Unsigned32:
			vals[i] = uint64(e.GetUnsigned32Value())
		case entities.Unsigned64:
			vals[i] = e.GetUnsigned64Value()
		case entities.String:
			vals[i] = e.GetStringValue()
		case entities.Ipv4Address, entities.Ipv6Address:
			a, ok := netip.AddrFromSlice(e.GetIPAddressValue())
			if !ok {
				return nil, fmt.Errorf("element %d (%s): bad address %v", i, e.GetName(), e.GetIPAddressValue())
			}
			vals[i] = a
		case entities.DateTimeSeconds:
			vals[i] = time.Unix(int64(e.GetUnsigned32Value()), 0).UTC()
		default:
			return nil, fmt.Errorf("element %d (%s): unexpected type %d", i, e.GetName(), e.GetDataType())
		}
	}
	return vals, nil
}

// diffValues compares a decoded record with what was sent, field by field,
// and describes every difference.
func diffValues(names []string, got, want []any) []string {
	var diffs []string
	if len(got) != len(want) || len(want) != len(names) {
		return []string{fmt.Sprintf("%d values decoded, %d sent, %d names", len(got), len(want), len(names))}
	}
	for i := range want {
		same := false
		switch w := want[i].(type) {
		case time.Time:
			g, ok := got[i].(time.Time)
			same = ok && g.Equal(w)
		default:
			same = got[i] == want[i]
		}
		if !same {
			diffs = append(diffs, fmt.Sprintf("%s: got %#v (%T), want %#v (%T)", names[i], got[i], got[i], want[i], want[i]))
		}
	}
	return diffs
}

// readTCP accepts one connection on ln and decodes it with Sluice until the
// peer closes it, calling rec for every data record (d.Record()).
func readTCP(ln net.Listener, rec func(d *ipfix.Decoder) error) error {
	conn, err := ln.Accept()
	if err != nil {
		return err
	}
	defer conn.Close()
	mr := ipfix.NewMessageReader(conn)
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	for {
		msg, err := mr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := d.Reset(msg, time.Now()); err != nil {
			return err
		}
		for d.Next() {
			if err := rec(d); err != nil {
				return err
			}
		}
		if err := d.Err(); err != nil {
			return err
		}
	}
}
