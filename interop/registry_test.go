package interop

import (
	"net/netip"
	"testing"
	"time"

	"sluice/ipfix"
)

// TestRegistryAgreesWithGoIPFIX checks that every element of the Antrea
// v2.7 templates (IPv4 and IPv6) has the same identity, type and length in
// both registries, so that both codecs read the same bytes the same way.
func TestRegistryAgreesWithGoIPFIX(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	for _, ipv6 := range []bool{false, true} {
		for _, name := range antreaNames(ipv6) {
			ours := reg.MustByName(name)
			theirs := goIPFIXElement(t, name)
			if theirs.Name != ours.Name || theirs.ElementId != ours.ID || theirs.EnterpriseId != ours.EnterpriseID {
				t.Errorf("%s: go-ipfix has %s %d/%d, we have %d/%d", name, theirs.Name, theirs.EnterpriseId, theirs.ElementId, ours.EnterpriseID, ours.ID)
			}
			// Both number data types as the IANA registry does.
			if uint8(theirs.DataType) != uint8(ours.Type) {
				t.Errorf("%s: go-ipfix type %d, ours %s (%d)", name, theirs.DataType, ours.Type, ours.Type)
			}
			if theirs.Len != ours.DefaultLength() {
				t.Errorf("%s: go-ipfix length %d, ours %d", name, theirs.Len, ours.DefaultLength())
			}
		}
	}
}

// TestSampleFlowMatchesTemplate checks that antreaFlow.values lists one
// value per template element, of a Go type that fits the element's type,
// so that a field written out of order is caught here and not only by a
// failing round trip.
func TestSampleFlowMatchesTemplate(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	for _, ipv6 := range []bool{false, true} {
		names := antreaNames(ipv6)
		f := sampleAntreaFlow(3, ipv6)
		vals := f.values()
		if len(vals) != len(names) {
			t.Fatalf("ipv6=%v: %d values for %d elements", ipv6, len(vals), len(names))
		}
		for i, v := range vals {
			ie := reg.MustByName(names[i])
			ok := false
			switch v := v.(type) {
			case uint64:
				ok = ie.Type.IsUnsigned() && (ie.DefaultLength() == 8 || v>>(8*ie.DefaultLength()) == 0)
			case string:
				ok = ie.Type == ipfix.String
			case netip.Addr:
				ok = (ie.Type == ipfix.IPv4Address && v.Is4()) || (ie.Type == ipfix.IPv6Address && v.Is6())
			case time.Time:
				ok = ie.Type.IsTime()
			}
			if !ok {
				t.Errorf("ipv6=%v: value %d (%#v) does not fit element %s of type %s", ipv6, i, v, ie.Name, ie.Type)
			}
		}
	}
}
