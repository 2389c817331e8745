package ctnetlink

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// AccountingSysctl is the sysctl that makes conntrack count packets and
// bytes per connection. It is per network namespace and off by default;
// without it every counter conntrack reports is 0.
const AccountingSysctl = "net.netfilter.nf_conntrack_acct"

// accountingFile is AccountingSysctl's file. /proc/sys/net shows the
// network namespace of the thread that opens it.
const accountingFile = "/proc/sys/net/netfilter/nf_conntrack_acct"

// Accounting reports whether conntrack counts packets and bytes in the
// network namespace netns (as Open names it; "" is the caller's own).
func Accounting(netns string) (bool, error) {
	var on bool
	err := inNetns(netns, func() error {
		b, err := os.ReadFile(accountingFile)
		if err != nil {
			return err
		}
		on = strings.TrimSpace(string(b)) != "0"
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("ctnetlink: reading %s (netns %q): %w", AccountingSysctl, netns, err)
	}
	return on, nil
}

// EnableAccounting turns conntrack's accounting on in netns when it is
// off, as Antrea's agent does, and reports whether it is on. Writing
// fails where /proc/sys is read-only (a container that is not
// privileged); then it returns false and the write's error.
func EnableAccounting(netns string) (bool, error) {
	on, err := Accounting(netns)
	if err != nil || on {
		return on, err
	}
	err = inNetns(netns, func() error {
		f, err := os.OpenFile(accountingFile, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		if _, err := f.Write([]byte("1\n")); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
	if err != nil {
		return false, fmt.Errorf("ctnetlink: setting %s=1 (netns %q): %w", AccountingSysctl, netns, err)
	}
	return Accounting(netns)
}

// inNetns runs fn on an OS thread moved into netns ("" runs it here).
// The thread is not handed back to the runtime if it cannot return to the
// original namespace, so no other goroutine runs in the wrong one.
func inNetns(netns string, fn func() error) error {
	if netns == "" {
		return fn()
	}
	path := netns
	if !strings.ContainsRune(netns, '/') {
		path = filepath.Join(NetnsDir, netns)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("network namespace %q: %w", netns, err)
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering network namespace %q: %w", netns, err)
			return
		}
		err = fn()
		if back := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); back == nil {
			runtime.UnlockOSThread()
		} else {
			err = errors.Join(err, fmt.Errorf("leaving network namespace %q: %w", netns, back))
		}
		errc <- err
	}()
	return <-errc
}
