package ipfixmap

import (
	"sluice/flow"
	"sluice/ipfix"
)

// CopyPlan says how records of the received template in can be forwarded
// as records of out, one of an Exporter's Base templates, by copying their
// values as received: src[j] is the field of in whose octets are the value
// of out's field j, or -1 when records of in do not carry that field's
// value (Write would write it zero or empty; export-only elements, such
// as the Proxy ones, are -1 too).
//
// ok is false when copying would not give exactly what Normalize then
// Write give, and records of in must take that path: when in has elements
// an exporter with passThrough would add to the template (unknown or
// legacy ones), an element mapped twice or two elements of one field
// (flowStartMilliseconds beside flowStartSeconds), or a value out takes
// from another element (the other IP family's, milliseconds for seconds)
// or at another length (a reduced-size integer).
func (t *Table) CopyPlan(in, out *ipfix.Template, passThrough bool) (src []int, ok bool) {
	byField := map[flow.Field]int{}
	for i := range in.Fields {
		f := &in.Fields[i]
		el, known := t.byKey[f.Key()]
		switch {
		case !known || f.IE == nil || f.Type != el.IE.Type:
			// Normalize keeps it aside, and Write passes it through.
			if passThrough {
				return nil, false
			}
			continue
		case el.get == nil:
			continue // export-only: received, it is not read
		case el.Field == flow.AppProtocolName || el.Field == flow.HTTPVals:
			if passThrough {
				return nil, false // the Exporter appends these legacy elements
			}
		}
		if _, dup := byField[el.Field]; dup {
			return nil, false
		}
		byField[el.Field] = i
	}
	src = make([]int, len(out.Fields))
	for j := range out.Fields {
		src[j] = -1
		of := &out.Fields[j]
		el, known := t.byKey[of.Key()]
		if !known || el.get == nil {
			continue
		}
		i, has := byField[el.Field]
		if !has {
			continue
		}
		if in.Fields[i].Key() != of.Key() || in.Fields[i].Length != of.Length {
			return nil, false
		}
		src[j] = i
	}
	return src, true
}
