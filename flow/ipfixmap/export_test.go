package ipfixmap

// Hooks for the external tests.

// DisableWritePlan makes e write every element with its put, as it did
// before write plans: the reference the plans are checked against.
func DisableWritePlan(e *Exporter) { e.plans = [2]*writePlan{} }

// PlanLeftToPut lists the elements of the base template of an IP family
// (4 or 6) that e's write plan leaves to their put.
func PlanLeftToPut(e *Exporter, family int) []string {
	fi := 0
	if family == 6 {
		fi = 1
	}
	var out []string
	for i, op := range e.plans[fi].ops {
		if op.kind == opPut {
			out = append(out, e.base[fi][i].Name())
		}
	}
	return out
}

// Planned is the number of records whose base fields e's plans wrote.
func Planned(e *Exporter) uint64 { return e.planned }
