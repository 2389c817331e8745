// Package image builds Sluice's container image as an OCI image layout
// in a tar file, without a container daemon or a registry: one layer with
// the static sluice binary, the users of /etc/passwd and a /tmp, on an
// empty base (what the Dockerfile's final stage holds). The tar loads with
// `ctr images import` (containerd, what kubelet uses), `kind load
// image-archive`, `podman load`, `skopeo copy oci-archive:...` or
// `docker load`, under the image's normalized name (see Options.Ref).
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

// Annotations of the layout index's manifest entry that name the image.
const (
	// AnnotationRefName is the OCI image specification's name of an
	// image in a layout.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationImageName is containerd's: `ctr images import` (and
	// `kind load image-archive`, which runs it) takes the image's name from
	// it and, without it, drops names that are not bare tags.
	AnnotationImageName = "io.containerd.image.name"
)

// epoch stamps every file, so that the same binary gives the same image.
var epoch = time.Unix(0, 0).UTC()

// Options describes the image.
type Options struct {
	// Binary is the static sluice executable to put in.
	Binary string
	// Ref is the image reference, such as "sluice:v0.1.0". The layout's
	// index records it normalized (see Normalize) in both
	// AnnotationImageName and AnnotationRefName: kubelet asks the runtime
	// for the normalized name of a Pod's image, so an image imported
	// under the short name would not be found.
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
	name, err := Normalize(o.Ref)
	if err != nil {
		return "", fmt.Errorf("image: %w", err)
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
		Annotations: map[string]string{AnnotationImageName: name, AnnotationRefName: name},
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

// Normalize gives the full name container runtimes and kubelet resolve an
// image reference to, as Docker's reference grammar does: a first path
// component with no ".", ":" or the name "localhost" is not a registry,
// so the name is on docker.io, where one-component names are under
// "library/"; no tag and no digest means ":latest". So "sluice:v0.1.0" is
// "docker.io/library/sluice:v0.1.0".
func Normalize(ref string) (string, error) {
	if ref == "" || strings.ContainsAny(ref, " \t\n") || strings.HasPrefix(ref, "/") || strings.Contains(ref, "//") {
		return "", fmt.Errorf("image reference %q is not valid", ref)
	}
	name, rest := ref, ""
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		name, rest = ref[:i], ref[i:]
	}
	// A tag follows the last ":" after the last "/" (a ":" before it is a
	// registry's port).
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		name, rest = name[:i], name[i:]+rest
	}
	if name == "" || strings.HasSuffix(name, "/") || rest == ":" {
		return "", fmt.Errorf("image reference %q is not valid", ref)
	}
	domain, path, more := strings.Cut(name, "/")
	if !more || (!strings.ContainsAny(domain, ".:") && domain != "localhost") {
		domain, path = "docker.io", name
	}
	if domain == "index.docker.io" {
		domain = "docker.io"
	}
	if path != strings.ToLower(path) {
		return "", fmt.Errorf("image reference %q: repository names are lower case", ref)
	}
	if domain == "docker.io" && !strings.Contains(path, "/") {
		path = "library/" + path
	}
	if rest == "" {
		rest = ":latest"
	}
	return domain + "/" + path + rest, nil
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
