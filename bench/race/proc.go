package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times; 100 on every Linux architecture Go supports here.
const clockTicks = 100

// The reference listens on fixed ports; Sluice is given the same ones so
// that both runs are alike.
const (
	ipfixPort = 4739
	grpcPort  = 14739
	apiPort   = 10348
)

// cpuSeconds is the user+system CPU time pid has used, from /proc.
func cpuSeconds(pid int) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are fixed: state is the first, utime the 12th,
	// stime the 13th.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad CPU times %q %q", pid, f[11], f[12])
	}
	return float64(ut+st) / clockTicks, nil
}

// memKB returns VmHWM (peak resident set) and VmRSS of pid, in KiB.
func memKB(pid int) (hwm, rss int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmHWM":
			hwm = n
		case "VmRSS":
			rss = n
		}
	}
	return hwm, rss, sc.Err()
}

// memAvailableKB is the kernel's estimate of memory available to a new
// process.
func memAvailableKB() int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// loadavg is the first three fields of /proc/loadavg.
func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// portsFree fails when another process holds one of the fixed ports.
func portsFree() error {
	for _, p := range []int{ipfixPort, grpcPort, apiPort} {
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			return fmt.Errorf("port %d is in use by another process (the reference's ports are fixed): %w", p, err)
		}
		ln.Close()
	}
	return nil
}

// aggProc is a running aggregator process.
type aggProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

func startProc(cmd *exec.Cmd, logFile string) (*aggProc, error) {
	lf, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group, so that stopping it reaches nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	p := &aggProc{cmd: cmd, exited: make(chan struct{}), log: logFile}
	go func() { _ = cmd.Wait(); lf.Close(); close(p.exited) }()
	return p, nil
}

func (p *aggProc) pid() int { return p.cmd.Process.Pid }

func (p *aggProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, then SIGKILL after grace.
func (p *aggProc) stop(grace time.Duration) {
	if !p.alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// tail is the end of the process's log, for error messages.
func (p *aggProc) tail() string {
	raw, _ := os.ReadFile(p.log)
	if len(raw) > 3000 {
		raw = raw[len(raw)-3000:]
	}
	return string(raw)
}

// waitListening waits until the process accepts TCP connections on port.
func (p *aggProc) waitListening(port int, deadline time.Time) error {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for {
		if !p.alive() {
			return fmt.Errorf("the aggregator exited before listening on %s; its log ends:\n%s", addr, p.tail())
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s: %w; the aggregator's log ends:\n%s", addr, err, p.tail())
		}
		time.Sleep(100 * time.Millisecond) // polling the port
	}
}
