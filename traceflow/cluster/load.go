package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Object is one Kubernetes object as read, before conversion. Keeping the
// raw JSON lets an overlay replace objects by identity before anything is
// interpreted.
type Object struct {
	APIVersion string
	Kind       string
	Namespace  string
	Name       string
	Source     string // "file.yaml#3": where it came from, for messages
	Raw        json.RawMessage
}

// ID is the object's identity: API group, kind, namespace and name.
func (o Object) ID() string {
	group := o.APIVersion
	if i := strings.IndexByte(group, '/'); i >= 0 {
		group = group[:i]
	} else {
		group = "" // the core group is written as just "v1"
	}
	return group + "|" + o.Kind + "|" + o.Namespace + "|" + o.Name
}

// Describe names the object for messages, e.g. "Pod default/web".
func (o Object) Describe() string {
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}

// maxFileSize bounds what one state file may hold, so a wrong path (a disk
// image, say) fails fast instead of filling memory.
const maxFileSize = 64 << 20

// ReadPath reads every object of a YAML/JSON file, or of every *.yaml,
// *.yml and *.json file directly inside a directory, in name order.
func ReadPath(ctx context.Context, path string) ([]Object, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cluster state: %w", err)
	}
	files := []string{path}
	if fi.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("cluster state: %w", err)
		}
		files = files[:0]
		for _, e := range entries {
			ext := strings.ToLower(filepath.Ext(e.Name()))
			if !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		sort.Strings(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("cluster state: directory %s holds no .yaml, .yml or .json file", path)
		}
	}
	var out []Object
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		objs, err := readFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

func readFile(path string) ([]Object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cluster state: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("cluster state: reading %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("cluster state: %s is larger than %d bytes", path, maxFileSize)
	}
	return ParseObjects(data, filepath.Base(path))
}

// ParseObjects splits multi-document YAML (or JSON, a YAML subset) into
// objects, expanding v1 Lists (`kubectl get -o yaml` output). name labels
// the source in messages.
func ParseObjects(data []byte, name string) ([]Object, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []Object
	for doc := 1; ; doc++ {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("cluster state: %s document %d: %w", name, doc, err)
		}
		if v == nil {
			continue // an empty document between separators
		}
		raw, err := json.Marshal(jsonable(v))
		if err != nil {
			return nil, fmt.Errorf("cluster state: %s document %d: %w", name, doc, err)
		}
		objs, err := splitObject(raw, fmt.Sprintf("%s#%d", name, doc))
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
}

type objectHead struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

func splitObject(raw json.RawMessage, source string) ([]Object, error) {
	var h objectHead
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("cluster state: %s: not a Kubernetes object: %w", source, err)
	}
	if h.Kind == "" {
		return nil, fmt.Errorf("cluster state: %s: object has no kind", source)
	}
	if strings.HasSuffix(h.Kind, "List") {
		var out []Object
		for i, item := range h.Items {
			objs, err := splitObject(item, fmt.Sprintf("%s item %d", source, i))
			if err != nil {
				return nil, err
			}
			out = append(out, objs...)
		}
		return out, nil
	}
	if h.Metadata.Name == "" {
		return nil, fmt.Errorf("cluster state: %s: %s has no metadata.name", source, h.Kind)
	}
	return []Object{{
		APIVersion: h.APIVersion, Kind: h.Kind, Namespace: h.Metadata.Namespace,
		Name: h.Metadata.Name, Source: source, Raw: raw,
	}}, nil
}

// jsonable turns what the YAML decoder produced into something
// encoding/json accepts: maps with non-string keys become string-keyed.
func jsonable(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = jsonable(e)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range t {
			t[i] = jsonable(e)
		}
		return t
	default:
		return v
	}
}

// Overlay returns base with every object of top added, replacing objects of
// the same identity: the what-if view of a proposed change.
func Overlay(base, top []Object) []Object {
	idx := map[string]int{}
	out := make([]Object, 0, len(base)+len(top))
	for _, o := range base {
		if i, ok := idx[o.ID()]; ok {
			out[i] = o
			continue
		}
		idx[o.ID()] = len(out)
		out = append(out, o)
	}
	for _, o := range top {
		if i, ok := idx[o.ID()]; ok {
			out[i] = o
			continue
		}
		idx[o.ID()] = len(out)
		out = append(out, o)
	}
	return out
}
