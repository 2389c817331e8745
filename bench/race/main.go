// Command race runs the reference's flow-aggregator and Sluice's aggregator
// as whole processes under the same agent load, one after the other in
// interleaved rounds, and prints what each needed: records per second at
// saturation, CPU seconds per million records, peak resident memory with
// the given number of tracked flows, and records lost. `make
// bench-reference` builds both and runs it; see docs/performance.md.
//
// Both run against a real etcd and kube-apiserver (test/kube/kubetest),
// each in a namespace of its own with a ServiceAccount token; the
// reference "in cluster", under `unshare -m` with a tmpfs over /var/run
// holding the token, so that nothing on the host changes. Four agents
// (IPFIX over TCP with the Antrea v2.7 agent's template, or gRPC
// FlowExportService with one Flow per request) send both sides of N
// inter-Node connections; the aggregator exports IPFIX over TCP to a
// receiver here that decodes every record and marks which connections
// arrived.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

type options struct {
	reference, sluice string
	rounds            int
	flows             []int
	modes, transports []string
	impls             []string
	dir               string
	benchOut          string
	runTimeout        time.Duration
	stall             time.Duration
	verbose           bool
	activeTimeout     time.Duration
}

type result struct {
	impl, mode, transport string
	flows, round          int
	input, expected       int
	distinct, records     int
	elapsed, sending      time.Duration // elapsed: until 99% of the expected output arrived (or the last, if less did)
	all                   time.Duration // until the last record arrived
	distinctAtMark        int
	cpu                   float64 // aggregator CPU seconds under load
	hwmKB, baseKB         int64
	load0, load1          string
	err                   error
}

func (r *result) lost() int { return r.expected - r.distinct }

// rate is the input records whose output reached the receiver, per
// second: records an aggregator dropped do not count as handled.
func (r *result) rate() float64 {
	return float64(r.input) * float64(r.distinctAtMark) / float64(r.expected) / r.elapsed.Seconds()
}

func (r *result) cpuPerM() float64 { return r.cpu / (float64(r.input) / 1e6) }

// bytesPerFlow is the peak resident memory above the idle process's,
// shared among the tracked flows.
func (r *result) bytesPerFlow() float64 {
	return float64(r.hwmKB-r.baseKB) * 1024 / float64(r.flows)
}

func main() {
	var o options
	var flows, modes, transports, impls string
	flag.StringVar(&o.reference, "reference", "", "the reference's flow-aggregator binary (scripts/build-reference-aggregator.sh)")
	flag.StringVar(&o.sluice, "sluice", "", "the sluice binary")
	flag.IntVar(&o.rounds, "rounds", 2, "interleaved rounds (reference, sluice, reference, sluice ...)")
	flag.StringVar(&flows, "flows", "100000,1000000,3000000", "tracked flows (connections) per run, comma-separated, smallest first")
	flag.StringVar(&modes, "modes", "Aggregate,Proxy", "aggregator modes")
	flag.StringVar(&transports, "transports", "ipfix-tcp,grpc", "agent transports")
	flag.StringVar(&impls, "impls", "reference,sluice", "aggregators, in the order each round runs them")
	flag.StringVar(&o.dir, "dir", "", "working directory (default: a new temporary one, removed at the end)")
	flag.StringVar(&o.benchOut, "bench-out", "", "also write the runs as Go benchmark lines (for benchstat) to this file")
	flag.DurationVar(&o.runTimeout, "run-timeout", 20*time.Minute, "bound on one run")
	flag.DurationVar(&o.stall, "stall", 30*time.Second, "a run ends when no new record reached the receiver for this long after the agents finished")
	flag.DurationVar(&o.activeTimeout, "active-timeout", time.Minute, "activeFlowRecordTimeout of both aggregators (Antrea's default; the reference re-queues every tracked flow this often, so with a short one its Aggregate CPU grows with the store)")
	flag.BoolVar(&o.verbose, "v", false, "print the receiver's count every second while a run waits for it")
	flag.Parse()
	var err error
	if o.flows, err = parseInts(flows); err != nil {
		fatal(err)
	}
	o.modes, o.transports, o.impls = split(modes), split(transports), split(impls)
	for _, m := range o.modes {
		if m != "Aggregate" && m != "Proxy" {
			fatal(fmt.Errorf("-modes: %q is not Aggregate or Proxy", m))
		}
	}
	for _, t := range o.transports {
		if t != "ipfix-tcp" && t != "grpc" {
			fatal(fmt.Errorf("-transports: %q is not ipfix-tcp or grpc", t))
		}
	}
	for _, i := range o.impls {
		switch i {
		case "reference":
			if o.reference == "" {
				fatal(errors.New("-reference: the reference's binary is needed (scripts/build-reference-aggregator.sh prints its path)"))
			}
			if os.Geteuid() != 0 {
				fatal(errors.New("the reference runs under `unshare -m` with a tmpfs over /var/run, which needs root"))
			}
		case "sluice":
			if o.sluice == "" {
				fatal(errors.New("-sluice: the sluice binary is needed (make build)"))
			}
		default:
			fatal(fmt.Errorf("-impls: %q is not reference or sluice", i))
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "race:", err)
	os.Exit(1)
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range split(s) {
		mult := 1
		switch {
		case strings.HasSuffix(f, "M"):
			mult, f = 1_000_000, strings.TrimSuffix(f, "M")
		case strings.HasSuffix(f, "k"):
			mult, f = 1000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n*mult > 1<<24 {
			return nil, fmt.Errorf("-flows: %q is not a count from 1 to 16M", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

func run(ctx context.Context, o options) error {
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "sluice-race-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if err := portsFree(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "race: starting etcd and kube-apiserver (load %s)\n", loadavg())
	k, err := startKube(ctx, filepath.Join(dir, "kube"))
	if err != nil {
		return err
	}
	defer k.stop()

	var bench io.Writer = io.Discard
	if o.benchOut != "" {
		f, err := os.Create(o.benchOut)
		if err != nil {
			return err
		}
		defer f.Close()
		bench = f
		fmt.Fprintf(f, "goos: linux\ngoarch: amd64\npkg: sluice/bench/race\ncpu: %s\n", cpuModel())
	}
	var results []*result
	seq := 0
	for _, n := range o.flows {
		for round := 1; round <= o.rounds; round++ {
			for _, mode := range o.modes {
				for _, tr := range o.transports {
					for _, impl := range o.impls {
						if ctx.Err() != nil {
							return ctx.Err()
						}
						seq++
						r := &result{impl: impl, mode: mode, transport: tr, flows: n, round: round}
						results = append(results, r)
						if need := needKB(impl, mode, n); memAvailableKB() < need {
							r.err = fmt.Errorf("skipped: %d MiB available, about %d MiB needed", memAvailableKB()>>10, need>>10)
						} else {
							r.err = runOne(ctx, k, o, filepath.Join(dir, fmt.Sprintf("run-%d", seq)), fmt.Sprintf("race-%d", seq), r)
						}
						printRun(os.Stderr, r)
						if r.err == nil {
							fmt.Fprintf(bench, "BenchmarkRace/mode=%s/transport=%s/flows=%d/impl=%s 1 %.0f ns/op %.0f records/s %.3f cpu-s/Mrecord %.1f peak-RSS-MB %.0f B/flow %d lost\n",
								r.mode, r.transport, r.flows, r.impl, float64(r.elapsed.Nanoseconds())/float64(r.input), r.rate(), r.cpuPerM(),
								float64(r.hwmKB)/1024, r.bytesPerFlow(), r.lost())
						}
					}
				}
			}
		}
	}
	printTable(os.Stdout, results)
	return nil
}

// needKB guesses the memory a run needs, to skip rather than push the
// shared machine into swapping or the OOM killer: the reference's
// Aggregate mode peaked at 3.1-4.1 KB a tracked flow with 1M flows,
// Sluice's under 1 KB.
func needKB(impl, mode string, n int) int64 {
	per := int64(1)
	if mode == "Aggregate" {
		per = 2
		if impl == "reference" {
			per = 5
		}
	}
	return int64(n)*per + 1<<20
}

func runOne(ctx context.Context, k *kube, o options, dir, ns string, r *result) error {
	ctx, cancel := context.WithTimeout(ctx, o.runTimeout)
	defer cancel()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := portsFree(); err != nil {
		return err
	}
	rc, err := k.namespace(ctx, ns)
	if err != nil {
		return err
	}
	r.input = 2 * r.flows
	r.expected = r.flows
	if r.mode == "Proxy" {
		r.expected = 2 * r.flows
	}
	recv, err := newReceiver(r.flows, r.expected*99/100)
	if err != nil {
		return err
	}
	defer recv.close()

	// The configuration's directory holds nothing else: the reference
	// watches it, and a log written beside it would wake it on every line
	// (each wake-up logs a line).
	if err := os.MkdirAll(filepath.Join(dir, "conf"), 0o700); err != nil {
		return err
	}
	conf := filepath.Join(dir, "conf", "flow-aggregator.conf")
	if err := os.WriteFile(conf, []byte(config(r.mode, recv.addr(), o.activeTimeout)), 0o600); err != nil {
		return err
	}
	var cmd *exec.Cmd
	host, port, err := k.hostPort()
	if err != nil {
		return err
	}
	switch r.impl {
	case "reference":
		sa := filepath.Join(dir, "serviceaccount")
		if err := writeServiceAccount(sa, ns, rc); err != nil {
			return err
		}
		// A mount namespace of its own, with a tmpfs over /var/run that
		// holds the ServiceAccount files where in-cluster clients look.
		cmd = exec.Command("unshare", "-m", "--propagation", "private", "--", "sh", "-ec",
			`mount -t tmpfs tmpfs /var/run
d=/var/run/secrets/kubernetes.io/serviceaccount
mkdir -p "$d"
cp "$RACE_SA"/token "$RACE_SA"/ca.crt "$RACE_SA"/namespace "$d"/
exec "$RACE_BIN" --config "$RACE_CONF"`)
		cmd.Env = append(os.Environ(), "RACE_SA="+sa, "RACE_BIN="+o.reference, "RACE_CONF="+conf,
			"KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port, "POD_NAMESPACE="+ns)
	case "sluice":
		kc := filepath.Join(dir, "kubeconfig")
		if err := writeKubeconfig(kc, rc); err != nil {
			return err
		}
		extra := fmt.Sprintf(`sluice:
  ipfixAddress: ":%d"
  grpcAddress: ":%d"
  apiAddress: ":%d"
  kubeconfig: %q
  tls: {certDir: %q}
  aggregate: {maxFlows: 16777216}
`, ipfixPort, grpcPort, apiPort, kc, filepath.Join(dir, "certs"))
		if err := os.WriteFile(conf, []byte(config(r.mode, recv.addr(), o.activeTimeout)+extra), 0o600); err != nil {
			return err
		}
		cmd = exec.Command(o.sluice, "aggregator", "--config", conf)
		cmd.Env = append(os.Environ(), "POD_NAMESPACE="+ns)
	}
	p, err := startProc(cmd, filepath.Join(dir, "aggregator.log"))
	if err != nil {
		return err
	}
	defer p.stop(20 * time.Second)
	ready := time.Now().Add(2 * time.Minute)
	var send func(a int) (func(), error)
	switch r.transport {
	case "ipfix-tcp":
		if err := p.waitListening(ipfixPort, ready); err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(ipfixPort)
		send = func(a int) (func(), error) { return sendIPFIX(ctx, addr, a, r.flows) }
	case "grpc":
		if err := p.waitListening(grpcPort, ready); err != nil {
			return err
		}
		tc, err := k.clientTLS(ctx, ns, ready)
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(grpcPort)
		send = func(a int) (func(), error) { return func() {}, sendGRPC(ctx, addr, tc, a, r.flows) }
	}
	pid := p.pid()
	_, r.baseKB, err = memKB(pid)
	if err != nil {
		return err
	}
	cpu0, err := cpuSeconds(pid)
	if err != nil {
		return err
	}
	r.load0 = loadavg()
	t0 := time.Now()
	errs := make([]error, agents)
	closers := make([]func(), agents)
	var wg sync.WaitGroup
	if o.verbose {
		sending := make(chan struct{})
		defer close(sending)
		go func() {
			for {
				select {
				case <-sending:
					return
				case <-time.After(5 * time.Second):
					d, _, _, _ := recv.counts()
					fmt.Fprintf(os.Stderr, "race:   %5.1fs: agents sending, %d of %d at the receiver, aggregator RSS %s\n", time.Since(t0).Seconds(), d, r.expected, rssString(pid))
				}
			}
		}()
	}
	for a := range agents {
		wg.Go(func() {
			var err error
			if closers[a], err = send(a); err != nil {
				errs[a] = fmt.Errorf("agent %d: %w", a, err)
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range closers {
			if c != nil {
				c()
			}
		}
	}()
	r.sending = time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w; the aggregator's log ends:\n%s", err, p.tail())
	}
	sentAt := time.Now()
	var last, mark time.Time
	nextReport := time.Now()
	for {
		r.distinct, r.records, last, mark = recv.counts()
		if o.verbose && time.Now().After(nextReport) {
			fmt.Fprintf(os.Stderr, "race:   %5.1fs: %d of %d at the receiver\n", time.Since(t0).Seconds(), r.distinct, r.expected)
			nextReport = nextReport.Add(time.Second)
		}
		if r.distinct >= r.expected {
			break
		}
		if !p.alive() {
			return fmt.Errorf("the aggregator exited under load; its log ends:\n%s", p.tail())
		}
		if time.Since(sentAt) > o.stall && time.Since(last) > o.stall {
			break // what has not arrived by now is lost
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("run bound reached with %d of %d records at the receiver: %w", r.distinct, r.expected, ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling the receiver's count
		}
	}
	cpu1, err := cpuSeconds(pid)
	if err != nil {
		return err
	}
	r.cpu = cpu1 - cpu0
	if last.IsZero() {
		last = time.Now()
	}
	r.elapsed, r.all = last.Sub(t0), last.Sub(t0)
	if !mark.IsZero() {
		// Throughput up to 99% delivered: the last records of a run
		// wait for an export timer (the reference holds a partly filled
		// message for up to seconds), which is latency, not throughput.
		r.elapsed = mark.Sub(t0)
		r.distinctAtMark = r.expected * 99 / 100
	} else {
		r.distinctAtMark = r.distinct
	}
	r.hwmKB, _, err = memKB(pid)
	if err != nil {
		return err
	}
	r.load1 = loadavg()
	if errs := recv.close(); len(errs) > 0 {
		return fmt.Errorf("the receiver could not decode the export: %w", errors.Join(errs...))
	}
	return nil
}

// config is the reference's flow-aggregator.conf for a run; Sluice reads
// the same keys. The active timeout is -active-timeout (Antrea's 60s by
// default); the inactive timeout is
// long so that every flow stays tracked until the run ends.
func config(mode, collector string, active time.Duration) string {
	return fmt.Sprintf(`mode: %s
activeFlowRecordTimeout: %s
inactiveFlowRecordTimeout: 30m
aggregatorTransportProtocol: tcp
flowCollector:
  enable: true
  address: "%s:tcp"
  recordFormat: IPFIX
flowLogger:
  enable: false
clickHouse:
  enable: false
s3Uploader:
  enable: false
`, mode, active, collector)
}

func printRun(w io.Writer, r *result) {
	if r.err != nil {
		fmt.Fprintf(w, "race: %s %s %s %d flows round %d: %v\n", r.impl, r.mode, r.transport, r.flows, r.round, r.err)
		return
	}
	fmt.Fprintf(w, "race: %-9s %-9s %-9s %8d flows round %d: %9.0f records/s, %6.2f CPU s/M records, peak RSS %7.1f MiB (idle %6.1f), %5.0f B/flow, lost %d (dup %d), sending %v, all out at %v, load %s -> %s\n",
		r.impl, r.mode, r.transport, r.flows, r.round, r.rate(), r.cpuPerM(), float64(r.hwmKB)/1024, float64(r.baseKB)/1024,
		r.bytesPerFlow(), r.lost(), r.records-r.distinct, r.sending.Round(time.Millisecond), r.all.Round(time.Millisecond), r.load0, r.load1)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// printTable prints, per mode, transport and size, each aggregator's
// medians over the rounds and Sluice's ratios to the reference.
func printTable(w io.Writer, rs []*result) {
	type key struct {
		mode, transport string
		flows           int
	}
	type agg struct {
		rate, cpu, perCPU, hwm, bpf []float64
		lost                        int
		n                           int
		loads                       []string
		errs                        []string
	}
	var keys []key
	groups := map[key]map[string]*agg{}
	for _, r := range rs {
		k := key{r.mode, r.transport, r.flows}
		if groups[k] == nil {
			groups[k] = map[string]*agg{}
			keys = append(keys, k)
		}
		a := groups[k][r.impl]
		if a == nil {
			a = &agg{}
			groups[k][r.impl] = a
		}
		if r.err != nil {
			a.errs = append(a.errs, strings.SplitN(r.err.Error(), "\n", 2)[0])
			continue
		}
		a.n++
		a.rate = append(a.rate, r.rate())
		a.cpu = append(a.cpu, r.cpuPerM())
		a.perCPU = append(a.perCPU, float64(r.input)/r.cpu)
		a.hwm = append(a.hwm, float64(r.hwmKB)/1024)
		a.bpf = append(a.bpf, r.bytesPerFlow())
		a.lost += r.lost()
		a.loads = append(a.loads, r.load0)
	}
	fmt.Fprintf(w, "\nCPU: %s; medians over rounds; load = 1/5/15-min load average when each run's load started\n\n", cpuModel())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\ttransport\tflows\taggregator\truns\trecords/s (to 99% out)\tCPU s/M records\trecords/CPU-s\tpeak RSS MiB\tB/flow\tlost\tload\t")
	var notes []string
	for _, k := range keys {
		for _, impl := range []string{"reference", "sluice"} {
			a := groups[k][impl]
			if a == nil {
				continue
			}
			for _, e := range a.errs {
				notes = append(notes, fmt.Sprintf("%s %s %d %s: %s", k.mode, k.transport, k.flows, impl, e))
			}
			if a.n == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t0\t-\t-\t-\t-\t-\t-\t-\t\n", k.mode, k.transport, k.flows, impl)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%.0f\t%.2f\t%.0f\t%.1f\t%.0f\t%d\t%s\t\n", k.mode, k.transport, k.flows, impl, a.n,
				median(a.rate), median(a.cpu), median(a.perCPU), median(a.hwm), median(a.bpf), a.lost, strings.Join(a.loads, " | "))
		}
		ref, sl := groups[k]["reference"], groups[k]["sluice"]
		if ref != nil && sl != nil && ref.n > 0 && sl.n > 0 {
			fmt.Fprintf(tw, "%s\t%s\t%d\tsluice/reference\t\t%.2fx\t\t%.2fx\t%.2fx\t%.2fx\t\t\t\n", k.mode, k.transport, k.flows,
				median(sl.rate)/median(ref.rate), median(sl.perCPU)/median(ref.perCPU), median(sl.hwm)/median(ref.hwm), median(sl.bpf)/median(ref.bpf))
		}
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(w, "note:", n)
	}
}

func rssString(pid int) string {
	_, rss, err := memKB(pid)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%.0f MiB", float64(rss)/1024)
}

// cpuModel is the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
