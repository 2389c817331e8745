package image_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/deploy/image"
)

// staticBinaryEnv names a static sluice binary built with exactly the
// flags of `make image` (the Makefile sets it after building one), so that
// the test need not compile it again: with flags of its own, that build
// shares nothing with the other builds and takes minutes.
const staticBinaryEnv = "SLUICE_STATIC_BINARY"

// makeImage is what `make image` does, read from `make -n image`.
type makeImage struct {
	ldflags string // of the static binary
	ref     string // the image reference
}

func readMakeImage(t *testing.T) makeImage {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "-n", "image")
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	build := regexp.MustCompile(`(?m)^CGO_ENABLED=0 \S+ build -trimpath -ldflags "([^"]*)" -o (\S+) \./cmd/sluice$`).FindStringSubmatch(string(out))
	ref := regexp.MustCompile(`(?m)^\S+ run \./cmd/sluice-image -binary (\S+) .*-ref (\S+)$`).FindStringSubmatch(string(out))
	if build == nil || ref == nil || build[2] != ref[1] {
		t.Fatalf("make -n image does not build a static binary with -trimpath and put it in an image with -ref:\n%s", out)
	}
	return makeImage{ldflags: build[1], ref: ref[2]}
}

const repoRoot = "../.."

// appVersion is the chart's appVersion, the one version of a release.
func appVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/helm/sluice/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion: *"?([^"\s]+)"?\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no appVersion in Chart.yaml:\n%s", b)
	}
	return string(m[1])
}

// TestVersionFromChart: `make image` stamps the binary with the chart's
// appVersion and names the image as the chart's default image
// (image.repository "sluice", tag "v" + appVersion), and the Dockerfile's
// default and the source's own version say the same release.
func TestVersionFromChart(t *testing.T) {
	v := appVersion(t)
	mk := readMakeImage(t)
	if !strings.Contains(" "+mk.ldflags+" ", " -X main.version="+v+" ") {
		t.Errorf("make image: ldflags %q do not set main.version=%s", mk.ldflags, v)
	}
	if want := "sluice:v" + v; mk.ref != want {
		t.Errorf("make image: -ref %s, want the chart's default image %s", mk.ref, want)
	}
	df, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^ARG VERSION=` + regexp.QuoteMeta(v) + `$`).Match(df) {
		t.Errorf("Dockerfile: no \"ARG VERSION=%s\"", v)
	}
	src, err := os.ReadFile(filepath.Join(repoRoot, "cmd/sluice/version.go"))
	if err != nil {
		t.Fatal(err)
	}
	// A build without -X main.version is a development build of the release.
	if !strings.Contains(string(src), `var version = "`+v+`-dev"`) {
		t.Errorf("cmd/sluice/version.go: the default version is not %s-dev", v)
	}
}

// TestImage builds the image as `make image` does (the static binary
// from SLUICE_STATIC_BINARY or built with the Makefile's flags), unpacks
// it as a runtime would (index, manifest, config, layer, every digest
// checked) and runs the image's entrypoint with its default command inside
// the unpacked root file system (chroot, as the image's user, when the
// test runs as root): it must print the chart's appVersion. Then it
// imports the image into a containerd of its own as on a Node: kubelet
// must find it under the chart's default image.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the sluice binary")
	}
	v := appVersion(t)
	mk := readMakeImage(t)
	dir := t.TempDir()
	bin := os.Getenv(staticBinaryEnv)
	if bin == "" {
		bin = filepath.Join(dir, "sluice")
		abs, err := filepath.Abs(repoRoot)
		if err != nil {
			t.Fatal(err)
		}
		build := exec.Command("go", "build", "-trimpath", "-ldflags", mk.ldflags, "-o", bin, "./cmd/sluice")
		build.Dir = abs
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	} else {
		t.Logf("%s=%s", staticBinaryEnv, bin)
	}
	var img bytes.Buffer
	if _, err := image.Build(&img, image.Options{Binary: bin, Ref: mk.ref}); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if _, err := image.Build(&again, image.Options{Binary: bin, Ref: mk.ref}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img.Bytes(), again.Bytes()) {
		t.Error("two builds of the same binary differ")
	}
	// What kubelet asks the runtime for when a Pod names "sluice:v0.1.0".
	kubeletName := "docker.io/library/sluice:v" + v

	t.Run("RunsSluiceVersion", func(t *testing.T) {
		files := untar(t, bytes.NewReader(img.Bytes()))
		if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
			t.Fatalf("oci-layout: %q", files["oci-layout"])
		}
		var idx image.Index
		mustJSON(t, files["index.json"], &idx)
		if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations[image.AnnotationImageName] != kubeletName ||
			idx.Manifests[0].Annotations[image.AnnotationRefName] != kubeletName {
			t.Fatalf("index: %+v, want both names %s", idx, kubeletName)
		}
		var man image.Manifest
		mustJSON(t, blob(t, files, idx.Manifests[0]), &man)
		var cfg image.Config
		mustJSON(t, blob(t, files, man.Config), &cfg)
		if cfg.OS != "linux" || cfg.Config.User != "65532:65532" || len(man.Layers) != 1 {
			t.Fatalf("config %+v, manifest %+v", cfg, man)
		}
		layerGz := blob(t, files, man.Layers[0])
		zr, err := gzip.NewReader(bytes.NewReader(layerGz))
		if err != nil {
			t.Fatal(err)
		}
		layer, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if got := sum(layer); len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != got {
			t.Fatalf("diff_ids %v, layer %s", cfg.RootFS.DiffIDs, got)
		}
		root := filepath.Join(t.TempDir(), "rootfs")
		unpack(t, bytes.NewReader(layer), root)

		args := append(cfg.Config.Entrypoint[1:], cfg.Config.Cmd...)
		cmd := exec.Command(filepath.Join(root, cfg.Config.Entrypoint[0]), args...)
		if os.Geteuid() == 0 {
			// Inside the image's root with nothing else: a dynamically linked
			// binary would not start. As the image's user: non-root works.
			cmd = exec.Command(cfg.Config.Entrypoint[0], args...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: image.NonRootUID, Gid: image.NonRootUID}}
			cmd.Dir = "/"
			cmd.Env = cfg.Config.Env
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
		if !strings.HasPrefix(string(out), "sluice "+v+" ") {
			t.Fatalf("sluice version printed %q, want version %s", out, v)
		}
		t.Logf("image %d bytes (layer %d compressed); %s", img.Len(), len(layerGz), strings.TrimSpace(string(out)))
	})

	t.Run("ContainerdImport", func(t *testing.T) {
		sock := startContainerd(t)
		tarball := filepath.Join(t.TempDir(), "sluice-image.tar")
		if err := os.WriteFile(tarball, img.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		// As on a Node (namespace k8s.io, kubelet's), with the native
		// snapshotter: overlayfs may not mount where the test runs.
		ctr(t, sock, "-n", "k8s.io", "images", "import", "--snapshotter", "native", tarball)
		out := ctr(t, sock, "-n", "k8s.io", "images", "ls", "-q")
		if got := strings.Fields(out); len(got) != 1 || got[0] != kubeletName {
			t.Fatalf("after import, containerd has the images %q; kubelet looks for %s", got, kubeletName)
		}
	})
}

// startContainerd runs a containerd with its own configuration, root,
// state and socket under a temporary directory, stopped when the test
// ends, and returns its socket.
func startContainerd(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"containerd", "ctr"} {
		if _, err := exec.LookPath(p); err != nil {
			missing(t, fmt.Sprintf("%s not installed (apt-get install containerd): %v", p, err))
		}
	}
	if os.Geteuid() != 0 {
		missing(t, "containerd needs root")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
# Only the image store is needed; no CRI, no metrics or debug listeners.
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command("containerd", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("containerd log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := exec.Command("ctr", "-a", sock, "version").Run()
		if err == nil {
			return sock
		}
		select {
		case werr := <-exited:
			exited <- werr
			t.Fatalf("containerd exited: %v", werr)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not answer on %s within 30s: %v", sock, err)
		}
	}
}

func ctr(t *testing.T, sock string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ctr", append([]string{"-a", sock}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// missing skips the test, or fails it when SLUICE_REQUIRE_PEERS=1 (CI).
func missing(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("SLUICE_REQUIRE_PEERS") == "1" {
		t.Fatalf("%s (SLUICE_REQUIRE_PEERS=1)", why)
	}
	t.Skipf("%s; set SLUICE_REQUIRE_PEERS=1 to make this a failure", why)
}

func TestNormalize(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"sluice:v0.1.0", "docker.io/library/sluice:v0.1.0"},
		{"sluice", "docker.io/library/sluice:latest"},
		{"me/sluice:1", "docker.io/me/sluice:1"},
		{"docker.io/sluice:1", "docker.io/library/sluice:1"},
		{"index.docker.io/me/sluice:1", "docker.io/me/sluice:1"},
		{"registry.example/sluice:v0.1.0", "registry.example/sluice:v0.1.0"},
		{"localhost:5000/sluice", "localhost:5000/sluice:latest"},
		{"localhost/sluice:v1", "localhost/sluice:v1"},
		{"sluice@sha256:0123", "docker.io/library/sluice@sha256:0123"},
		{"reg:5000/a/b:t@sha256:0123", "reg:5000/a/b:t@sha256:0123"},
	} {
		got, err := image.Normalize(c.in)
		if err != nil || got != c.want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "Sluice:v1", "sluice:", "/sluice", "a//b", "sluice v1"} {
		if got, err := image.Normalize(bad); err == nil {
			t.Errorf("Normalize(%q) = %q, want an error", bad, got)
		}
	}
}

func untar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[h.Name] = b
		}
	}
}

func unpack(t *testing.T, r io.Reader, root string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, h.Name)
		if !strings.HasPrefix(p, root+string(os.PathSeparator)) {
			t.Fatalf("layer entry %q leaves the root", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode)&os.ModePerm); err != nil {
				t.Fatal(err)
			}
			_ = os.Chmod(p, os.FileMode(h.Mode)&os.ModePerm)
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, os.FileMode(h.Mode)&os.ModePerm); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("layer entry %q of type %c", h.Name, h.Typeflag)
		}
		if os.Geteuid() == 0 {
			_ = os.Lchown(p, h.Uid, h.Gid)
		}
	}
}

func blob(t *testing.T, files map[string][]byte, d image.Descriptor) []byte {
	t.Helper()
	name := "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:")
	b, ok := files[name]
	if !ok {
		t.Fatalf("blob %s missing", d.Digest)
	}
	if sum(b) != d.Digest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: digest %s, size %d (want %d)", d.Digest, sum(b), len(b), d.Size)
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
}
