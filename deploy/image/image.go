// Package image builds Sluice's container image as an OCI image layout
// in a tar file, without a container daemon or a registry: one layer with
// the static sluice binary, the users of /etc/passwd and a /tmp, on an
// empty base (what the Dockerfile's final stage holds). The tar loads with
// `podman load`, `skopeo copy oci-archive:...` or `docker load`.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
	"time"
)

// Paths and user of the image; the Dockerfile uses the same.
const (
	BinaryPath = "/usr/local/bin/sluice"
	// NonRootUID is the user the aggregator runs as.
	NonRootUID = 65532
)

// Media types of the OCI image specification.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// epoch stamps every file, so that the same binary gives the same image.
var epoch = time.Unix(0, 0).UTC()

// Options describes the image.
type Options struct {
	// Binary is the static sluice executable to put in.
	Binary string
	// Ref is the image reference recorded in the layout's index
	// (org.opencontainers.image.ref.name), such as "sluice:v0.1.0".
	Ref string
	// Arch is the GOARCH of Binary; runtime.GOARCH if empty.
	Arch string

	// Program, Cmd and User make an image of another static program
	// (the real-cluster tests' workload): where Binary goes and the
	// entrypoint (BinaryPath if empty), the default command (["version"]
	// if nil) and the user ("65532:65532" if empty).
	Program string
	Cmd     []string
	User    string
}

// Descriptor points at a blob.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform is the OS and architecture of an image.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Index is an OCI image index (index.json of a layout).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Config is the part of an OCI image configuration Sluice sets.
type Config struct {
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Created      string          `json:"created"`
	Config       ContainerConfig `json:"config"`
	RootFS       RootFS          `json:"rootfs"`
}

// ContainerConfig is how a container of the image starts.
type ContainerConfig struct {
	User         string              `json:"User"`
	Entrypoint   []string            `json:"Entrypoint"`
	Cmd          []string            `json:"Cmd"`
	Env          []string            `json:"Env"`
	WorkingDir   string              `json:"WorkingDir"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts"`
	Labels       map[string]string   `json:"Labels,omitempty"`
}

// RootFS lists the uncompressed layer digests.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// Build writes the image to w as an OCI layout tar and returns the
// manifest's digest.
func Build(w io.Writer, o Options) (string, error) {
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return "", fmt.Errorf("image: %w", err)
	}
	if o.Program == "" {
		o.Program = BinaryPath
	}
	if o.Cmd == nil {
		o.Cmd = []string{"version"}
	}
	if o.User == "" {
		o.User = fmt.Sprintf("%d:%d", NonRootUID, NonRootUID)
	}
	layerTar, err := rootfs(bin, o.Program)
	if err != nil {
		return "", err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.ModTime = epoch
	if _, err := zw.Write(layerTar); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	cfg := Config{
		Architecture: o.Arch, OS: "linux", Created: epoch.Format(time.RFC3339),
		Config: ContainerConfig{
			User:       o.User,
			Entrypoint: []string{o.Program},
			Cmd:        o.Cmd,
			Env:        []string{"PATH=/usr/local/bin"},
			WorkingDir: "/",
			ExposedPorts: map[string]struct{}{"4739/tcp": {}, "4739/udp": {}, "14739/tcp": {}, "14740/tcp": {},
				"10348/tcp": {}},
			Labels: map[string]string{"org.opencontainers.image.title": "sluice"},
		},
		RootFS: RootFS{Type: "layers", DiffIDs: []string{digest(layerTar)}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	man := Manifest{SchemaVersion: 2, MediaType: mediaManifest,
		Config: Descriptor{MediaType: mediaConfig, Digest: digest(cfgJSON), Size: int64(len(cfgJSON))},
		Layers: []Descriptor{{MediaType: mediaLayer, Digest: digest(gz.Bytes()), Size: int64(gz.Len())}},
	}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return "", err
	}
	idx := Index{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []Descriptor{{
		MediaType: mediaManifest, Digest: digest(manJSON), Size: int64(len(manJSON)),
		// containerd's importer (ctr images import) names the image by
		// its own annotation; the OCI one is for other tools.
		Annotations: map[string]string{"org.opencontainers.image.ref.name": o.Ref, "io.containerd.image.name": o.Ref},
		Platform:    &Platform{Architecture: o.Arch, OS: "linux"},
	}}}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(w)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", idxJSON},
		{blobPath(digest(cfgJSON)), cfgJSON},
		{blobPath(digest(gz.Bytes())), gz.Bytes()},
		{blobPath(digest(manJSON)), manJSON},
	}
	dirs := []string{"blobs/", "blobs/sha256/"}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			return "", err
		}
	}
	for _, f := range files {
		if err := writeFile(tw, f.name, 0o644, 0, f.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return digest(manJSON), nil
}

// rootfs is the image's only layer, uncompressed.
func rootfs(bin []byte, program string) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootUID, NonRootUID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRootUID)
	for _, d := range []struct {
		name string
		mode int64
		uid  int
	}{{"etc/", 0o755, 0}, {"tmp/", 0o1777, 0}, {"home/", 0o755, 0}, {"home/nonroot/", 0o700, NonRootUID},
		{"usr/", 0o755, 0}, {"usr/local/", 0o755, 0}, {"usr/local/bin/", 0o755, 0}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, Uid: d.uid, Gid: d.uid,
			ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := writeFile(tw, "etc/passwd", 0o644, 0, []byte(passwd)); err != nil {
		return nil, err
	}
	if err := writeFile(tw, "etc/group", 0o644, 0, []byte(group)); err != nil {
		return nil, err
	}
	if err := writeFile(tw, path.Clean(strings.TrimPrefix(program, "/")), 0o755, 0, bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeFile(tw *tar.Writer, name string, mode int64, uid int, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: uid, Gid: uid,
		Size: int64(len(data)), ModTime: epoch}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func blobPath(d string) string { return "blobs/sha256/" + d[len("sha256:"):] }
