// Command testkit is the workload of the real-cluster tests
// (test/cluster) and of scripts/local-cluster.sh: one static binary, put
// in an image of its own, that is the Pods' sandbox (pause), a server, a
// client that makes a known number of requests of known sizes, and a
// probe. It also writes that image (image).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"sluice/deploy/image"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testkit pause|serve|client|get|image [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch os.Args[1] {
	case "pause":
		<-ctx.Done()
	case "serve":
		err = serve(ctx, os.Args[2:])
	case "client":
		err = client(ctx, os.Args[2:])
	case "get":
		err = get(ctx, os.Args[2:])
	case "image":
		err = writeImage(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Printf("testkit %s: %v", os.Args[1], err)
		os.Exit(1)
	}
}

// serve answers GET /bytes/N with N bytes, and /healthz.
func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("listen", ":8080", "address to listen on")
	_ = fs.Parse(args)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/bytes/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.PathValue("n"))
		if err != nil || n < 0 || n > 64<<20 {
			http.Error(w, "bad size", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		bw := bufio.NewWriter(w)
		for range n {
			_ = bw.WriteByte('x')
		}
		_ = bw.Flush()
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Printf("serving on %s", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// client makes -requests requests of -size bytes each to -url/bytes/SIZE,
// each on a connection of its own, then prints one summary line and waits
// for SIGTERM (so that its Pod, and the Pod's IP, stay for the records).
// A request that fails is counted, not retried.
func client(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	url := fs.String("url", "", "base URL of the server (default http://$SERVER_SERVICE_HOST:$SERVER_SERVICE_PORT)")
	n := fs.Int("requests", 10, "number of requests")
	size := fs.Int("size", 1000, "bytes asked for in each response")
	timeout := fs.Duration("timeout", 3*time.Second, "timeout of each request")
	interval := fs.Duration("interval", 100*time.Millisecond, "pause between requests")
	wait := fs.Bool("wait", false, "first wait until the server answers /healthz (those requests are not counted)")
	_ = fs.Parse(args)
	if *url == "" {
		*url = "http://" + net.JoinHostPort(os.Getenv("SERVER_SERVICE_HOST"), os.Getenv("SERVER_SERVICE_PORT"))
	}
	hc := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	if *wait {
		probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		for tries := 1; ; tries++ {
			resp, err := probe.Get(*url + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					log.Printf("the server answers after %d tries", tries)
					break
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	ok, failed, body := 0, 0, 0
	for i := range *n {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(*interval):
			}
		}
		resp, err := hc.Get(fmt.Sprintf("%s/bytes/%d", *url, *size))
		if err != nil {
			failed++
			log.Printf("request %d: %v", i, err)
			continue
		}
		b, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
			log.Printf("request %d: status %d, %v", i, resp.StatusCode, err)
			continue
		}
		ok++
		body += int(b)
	}
	// The test reads this line from the Pod's log.
	fmt.Printf("DONE requests=%d ok=%d failed=%d bodyBytes=%d\n", *n, ok, failed, body)
	<-ctx.Done()
	return nil
}

// get fetches a URL once and fails on anything but 200: an exec probe
// (static busybox's wget crashes in these containers).
func get(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: testkit get URL")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", args[0], resp.Status)
	}
	return nil
}

// writeImage writes an OCI image holding this very binary as its
// entrypoint, with "pause" as the default command, so the same image
// serves as the Pods' sandbox image.
func writeImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ExitOnError)
	out := fs.String("o", "testkit.tar", "output file (OCI image layout, tar)")
	ref := fs.String("ref", "example.invalid/testkit:1", "image reference")
	_ = fs.Parse(args)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	_, err = image.Build(w, image.Options{Binary: self, Ref: *ref, Program: "/testkit", Cmd: []string{"pause"}, User: "0:0"})
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
