package flowproto

import (
	"encoding/json"
	"testing"

	"sluice/flow/flowtest"
)

// FuzzJSONTranscode: any bytes given to the transcoder give an error or
// valid JSON, never a panic.
func FuzzJSONTranscode(f *testing.F) {
	for i := range 4 {
		fl := flowtest.Full(i, i%2 == 0)
		fl.SourcePodLabels = `{"a":"1","a":"2","b":"\u0001"}`
		b, err := AppendFlow(nil, fl)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		out, err := appendJSONMessage(nil, wire, flowJSON())
		if err == nil && !json.Valid(out) {
			t.Fatalf("%x: not JSON: %s", wire, out)
		}
	})
}
