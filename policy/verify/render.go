package verify

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Write renders the report as table, json or yaml.
func (r *Report) Write(w io.Writer, format string) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	case "yaml":
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	case "table":
		return r.table(w)
	}
	return fmt.Errorf("output format %q: want table, json or yaml", format)
}

func (r *Report) table(out io.Writer) error {
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "%d distinct connections from %d records: %d newly blocked, %d newly allowed, %d unchanged",
		r.Connections, r.Records, len(r.NewlyBlocked), len(r.NewlyAllowed), r.Unchanged)
	if r.NotModelled > 0 {
		fmt.Fprintf(w, ", %d not modelled (neither end a Pod)", r.NotModelled)
	}
	if r.Errors > 0 {
		fmt.Fprintf(w, ", %d the model could not replay", r.Errors)
	}
	fmt.Fprintln(w)
	for _, sec := range []struct {
		title string
		flows []Flow
	}{{"newly blocked (observed allowed, blocked by the candidates)", r.NewlyBlocked},
		{"newly allowed (denied now, allowed by the candidates)", r.NewlyAllowed}} {
		if len(sec.flows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", sec.title)
		fmt.Fprintln(w, "  SOURCE\tDESTINATION\tPORT\tRECORDS\tLAST SEEN\tRULE")
		for _, f := range sec.flows {
			port := f.Protocol
			if f.Port != 0 {
				port = fmt.Sprintf("%s/%d", f.Protocol, f.Port)
			}
			last := "-"
			if !f.LastSeen.IsZero() {
				last = f.LastSeen.UTC().Format("2006-01-02T15:04:05Z")
			}
			fmt.Fprintf(w, "  %s\t%s\t%s\t%d\t%s\t%s\n", f.Source, f.Destination, port, f.Records, last, f.Rule)
		}
	}
	fmt.Fprintf(w, "\nunobserved allowed surface: %d", r.SurfaceTotal)
	if r.SurfaceTotal > len(r.Surface) {
		fmt.Fprintf(w, " (%d listed)", len(r.Surface))
	}
	fmt.Fprintln(w)
	if len(r.Surface) > 0 {
		fmt.Fprintln(w, "  POLICY\tRULE\tSOURCE\tDESTINATION\tPORT")
		for _, s := range r.Surface {
			fmt.Fprintf(w, "  %s\t%s[%d]\t%s\t%s\t%s\n", s.Policy, s.Direction, s.Rule, s.Source, s.Destination, s.Port)
		}
	}
	if r.SurfaceNote != "" {
		fmt.Fprintf(w, "  (%s)\n", r.SurfaceNote)
	}
	return w.Flush()
}
