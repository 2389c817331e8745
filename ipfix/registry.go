package ipfix

import (
	"fmt"
	"strings"
	"sync"
)

// Enterprise numbers that have a meaning of their own in this codec.
const (
	// EnterpriseIANA is the (implicit) enterprise of IANA-assigned elements.
	EnterpriseIANA uint32 = 0
	// EnterpriseReverse carries RFC 5103 reverse elements: the same element
	// ID as the forward element, for the reverse direction of a biflow.
	EnterpriseReverse uint32 = 29305
	// EnterpriseAntrea is Project Antrea's private enterprise number.
	EnterpriseAntrea uint32 = 56506
)

// InfoElement describes one Information Element: its identity on the wire
// (enterprise number and element ID), its name and its abstract data type.
type InfoElement struct {
	Name         string
	EnterpriseID uint32
	ID           uint16
	Type         DataType
	// Length is the default encoded length; VariableLength for strings and
	// octet arrays of no fixed size. Zero means the type's default.
	Length uint16
}

// DefaultLength is the length an encoder uses for this element when a field
// list does not say otherwise.
func (ie *InfoElement) DefaultLength() uint16 {
	if ie.Length != 0 {
		return ie.Length
	}
	return ie.Type.DefaultLength()
}

func (ie *InfoElement) String() string {
	return fmt.Sprintf("%s(%d/%d)", ie.Name, ie.EnterpriseID, ie.ID)
}

// ElementKey identifies an element on the wire.
type ElementKey struct {
	EnterpriseID uint32
	ID           uint16
}

func (k ElementKey) String() string { return fmt.Sprintf("%d:%d", k.EnterpriseID, k.ID) }

// Registry maps element identities and names to their descriptions. A
// Registry is immutable once built and safe for concurrent use.
type Registry struct {
	byKey  map[ElementKey]*InfoElement
	byName map[string]*InfoElement
}

// NewRegistry builds a registry from element lists. A later element with the
// same (enterprise, ID) or name as an earlier one is an error, so that a
// typo in a table cannot silently shadow another element.
func NewRegistry(lists ...[]InfoElement) (*Registry, error) {
	r := &Registry{byKey: map[ElementKey]*InfoElement{}, byName: map[string]*InfoElement{}}
	for _, list := range lists {
		for i := range list {
			ie := list[i]
			if ie.Length == 0 {
				ie.Length = ie.Type.DefaultLength()
			}
			if !ie.Type.ValidLength(ie.Length) {
				return nil, fmt.Errorf("ipfix registry: %s: length %d is not valid for %s", &ie, ie.Length, ie.Type)
			}
			k := ElementKey{ie.EnterpriseID, ie.ID}
			if old, dup := r.byKey[k]; dup {
				return nil, fmt.Errorf("ipfix registry: %s and %s share an identity", old, &ie)
			}
			if old, dup := r.byName[ie.Name]; dup {
				return nil, fmt.Errorf("ipfix registry: %s and %s share a name", old, &ie)
			}
			p := &ie
			r.byKey[k] = p
			r.byName[ie.Name] = p
		}
	}
	return r, nil
}

// Lookup finds an element by enterprise number and element ID.
func (r *Registry) Lookup(enterprise uint32, id uint16) (*InfoElement, bool) {
	ie, ok := r.byKey[ElementKey{enterprise, id}]
	return ie, ok
}

// ByName finds an element by its registered name.
func (r *Registry) ByName(name string) (*InfoElement, bool) {
	ie, ok := r.byName[name]
	return ie, ok
}

// MustByName is ByName for element names fixed in code; it panics on a name
// the registry lacks, which is a programming error caught by any test.
func (r *Registry) MustByName(name string) *InfoElement {
	ie, ok := r.byName[name]
	if !ok {
		panic("ipfix: no element named " + name)
	}
	return ie
}

// Len is the number of elements in the registry.
func (r *Registry) Len() int { return len(r.byKey) }

// reverseElements derives the RFC 5103 reverse counterpart of every
// reversible IANA element: same ID, enterprise 29305, name prefixed with
// "reverse".
func reverseElements(forward []InfoElement) []InfoElement {
	out := make([]InfoElement, 0, len(forward))
	for _, ie := range forward {
		if !reversible(ie.ID) {
			continue
		}
		ie.EnterpriseID = EnterpriseReverse
		ie.Name = "reverse" + strings.ToUpper(ie.Name[:1]) + ie.Name[1:]
		out = append(out, ie)
	}
	return out
}

// reversible reports whether RFC 5103 §6.1 allows a reverse counterpart:
// not the flow key fields' identifiers of the process, nor the
// list/padding/metadata elements that describe the export itself.
func reversible(id uint16) bool {
	switch id {
	case 130, 131, // exporterIPv4/IPv6Address
		137, 138, 141, 142, // commonPropertiesId, observationPointId, lineCardId, portId
		143, 144, 145, 148, 149, // meteringProcessId, exportingProcessId, templateId, flowId, observationDomainId
		173,           // flowKeyIndicator
		210,           // paddingOctets
		211, 212, 213, // collectorIPv4/IPv6Address, exportInterface
		214, 215, 216, 217, // exportProtocolVersion, exportTransportProtocol, collectorTransportPort, exporterTransportPort
		239,           // biflowDirection
		291, 292, 293, // basicList, subTemplateList, subTemplateMultiList
		403, 404, 405: // originalExporter*, originalObservationDomainId
		return false
	}
	return true
}

var defaultRegistry = sync.OnceValue(func() *Registry {
	iana := ianaElements()
	r, err := NewRegistry(iana, reverseElements(iana), antreaElements())
	if err != nil {
		// The tables are compiled in; a test covers this path.
		panic(err)
	}
	return r
})

// DefaultRegistry returns the built-in registry: the IANA elements used by
// Antrea, softflowd, Open vSwitch and nfdump, their RFC 5103 reverse
// counterparts, and the complete Antrea registry (enterprise 56506).
func DefaultRegistry() *Registry { return defaultRegistry() }
