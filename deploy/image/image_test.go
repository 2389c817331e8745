package image_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"sluice/deploy/image"
)

// TestImageRunsSluiceVersion builds the static binary and the image,
// unpacks the image as a runtime would (index, manifest, config, layer,
// every digest checked), and runs the image's entrypoint with its default
// command inside the unpacked root file system (chroot, as the image's
// user, when the test runs as root): it must print the version.
func TestImageRunsSluiceVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the sluice binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-ldflags", "-s -w -X main.version=9.8.7-test", "-o", bin, "sluice/cmd/sluice")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var img bytes.Buffer
	if _, err := image.Build(&img, image.Options{Binary: bin, Ref: "sluice:test"}); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if _, err := image.Build(&again, image.Options{Binary: bin, Ref: "sluice:test"}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img.Bytes(), again.Bytes()) {
		t.Error("two builds of the same binary differ")
	}

	files := untar(t, bytes.NewReader(img.Bytes()))
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout: %q", files["oci-layout"])
	}
	var idx image.Index
	mustJSON(t, files["index.json"], &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "sluice:test" {
		t.Fatalf("index: %+v", idx)
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
	root := filepath.Join(dir, "rootfs")
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
	if !strings.HasPrefix(string(out), "sluice 9.8.7-test ") {
		t.Fatalf("sluice version printed %q", out)
	}
	t.Logf("image %d bytes (layer %d compressed); %s", img.Len(), len(layerGz), strings.TrimSpace(string(out)))
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
