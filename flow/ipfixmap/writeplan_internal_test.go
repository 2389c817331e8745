package ipfixmap

import (
	"testing"

	"sluice/ipfix"
)

// A plan whose element carries a code that neither write nor fill knows
// (an element added to the table without a plan case) is not used: the
// elements' put writes the template, and nothing panics.
func TestWritePlanUnknownCodeLeftToPut(t *testing.T) {
	for _, tc := range []struct {
		name string
		ie   *ipfix.InfoElement
		val  valRef
	}{
		{"fixed", &ipfix.InfoElement{Name: "x", ID: 900, Type: ipfix.Unsigned32, Length: 4}, valRef{kind: valUint, width: 4, code: cNone - 1}},
		{"string", &ipfix.InfoElement{Name: "y", ID: 901, Type: ipfix.String, Length: ipfix.VariableLength}, valRef{kind: valString, code: cNone - 1}},
	} {
		tmpl, err := ipfix.TemplateOf(ipfix.MinDataSetID, tc.ie)
		if err != nil {
			t.Fatal(err)
		}
		p := newWritePlan([]*Element{{IE: tc.ie, val: tc.val}}, tmpl)
		if p.ok {
			t.Errorf("%s: a plan with an unknown code is used", tc.name)
		}
	}
}
