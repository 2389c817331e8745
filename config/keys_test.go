package config_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sluice/config"
)

// acceptedOnly are the keys Sluice accepts so that Antrea's files load,
// and deliberately does nothing with; docs/aggregator.md says so for each.
// Every other key must be read by the code it configures.
var acceptedOnly = map[string]string{
	"apiServer.apiPort":         "Sluice serves its HTTP API on sluice.apiAddress",
	"apiServer.tlsCipherSuites": "Sluice's HTTP API is plain HTTP (metrics and probes)",
	"apiServer.tlsMinVersion":   "Sluice's HTTP API is plain HTTP (metrics and probes)",
	"flowLogger.recordFormat":   "CSV is the only format, and validation refuses any other",
}

// consumerExceptions are the exported functions of package config whose
// reading of a field does not make the key used: decoding, defaults and
// validation read every key without acting on it.
var consumerExceptions = map[string]bool{
	"Validate": true, "Default": true, "Load": true, "LoadWith": true, "Parse": true, "ParseWith": true,
	"Decode": true, "KeyError": true, "Line": true, "Source": true,
}

// TestEveryKeyIsRead fails when the configuration accepts a key that no
// code reads: a key that is decoded, defaulted and validated, and then
// ignored (as flowCollector.tls.caSecretName once was). It type-checks the
// module's non-test code and requires, for every key's field, a use
// outside package config, or in one of config's exported accessors
// (FlowCollector.Target, say) other than decoding and validation. Keys
// accepted only for compatibility are listed in acceptedOnly.
func TestEveryKeyIsRead(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the module")
	}
	used, err := fieldUses(t)
	if err != nil {
		t.Fatal(err)
	}
	keys := configKeys(reflect.TypeFor[config.Aggregator](), "")
	if len(keys) < 80 {
		t.Fatalf("only %d keys found: the walk of the configuration is broken", len(keys))
	}
	for _, k := range keys {
		_, accepted := acceptedOnly[k.path]
		switch {
		case used[k.field] && accepted:
			t.Errorf("%s (%s) is listed as accepted only, but code reads it: take it off the list", k.path, k.field)
		case !used[k.field] && !accepted:
			t.Errorf("%s (%s) is parsed, but no code reads it", k.path, k.field)
		}
	}
	for k := range acceptedOnly {
		if !slicesContainsKey(keys, k) {
			t.Errorf("acceptedOnly lists %s, which is not a key", k)
		}
	}
}

func slicesContainsKey(keys []key, path string) bool {
	for _, k := range keys {
		if k.path == path {
			return true
		}
	}
	return false
}

// key is one key of the file and the struct field it decodes into
// ("FlowCollector.Address": the struct type's name and the field's).
type key struct {
	path, field string
}

// configKeys lists the leaf keys under t (the decoder's view: structs are
// sections, lists of structs hold sections, Duration and the rest are
// values).
func configKeys(t reflect.Type, prefix string) []key {
	var out []key
	for i := range t.NumField() {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		ft := f.Type
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			out = append(out, key{path, t.Name() + "." + f.Name})
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[config.Duration]() {
			out = append(out, configKeys(ft, path)...)
			continue
		}
		out = append(out, key{path, t.Name() + "." + f.Name})
	}
	return out
}

// goPackage is what `go list -json` says of a package.
type goPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Export     string
	Standard   bool
	ImportMap  map[string]string
}

// fieldUses type-checks, from source, package config and every package of
// the module that imports it (their dependencies from the build's export
// data), and returns the fields of config's struct types ("Type.Field")
// their non-test code reads.
func fieldUses(t *testing.T) (map[string]bool, error) {
	cmd := exec.Command("go", "list", "-deps", "-export", "-json", "sluice/...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w\n%s", err, stderr.String())
	}
	pkgs := map[string]*goPackage{}
	var order []string
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		pkgs[p.ImportPath] = &p
		order = append(order, p.ImportPath)
	}
	fset := token.NewFileSet()
	lookup := func(path string) (io.ReadCloser, error) {
		p, ok := pkgs[path]
		if !ok || p.Export == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(p.Export)
	}
	imp := importer.ForCompiler(fset, "gc", lookup).(types.ImporterFrom)

	check := func(p *goPackage, conf types.Config) (*types.Package, *types.Info, []*ast.File, error) {
		var files []*ast.File
		for _, f := range p.GoFiles {
			af, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.SkipObjectResolution)
			if err != nil {
				return nil, nil, nil, err
			}
			files = append(files, af)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
		tp, err := conf.Check(p.ImportPath, fset, files, info)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("type-checking %s: %w", p.ImportPath, err)
		}
		return tp, info, files, nil
	}

	// Package config itself, whose struct types are the ones to find.
	cfgPkg := pkgs["sluice/config"]
	cfgTypes, cfgInfo, cfgFiles, err := check(cfgPkg, types.Config{Importer: importerFor(cfgPkg, imp)})
	if err != nil {
		return nil, err
	}
	fieldName := map[*types.Var]string{}
	for _, name := range cfgTypes.Scope().Names() {
		tn, ok := cfgTypes.Scope().Lookup(name).(*types.TypeName)
		if !ok {
			continue
		}
		st, ok := tn.Type().Underlying().(*types.Struct)
		if !ok {
			continue
		}
		for i := range st.NumFields() {
			fieldName[st.Field(i)] = name + "." + st.Field(i).Name()
		}
	}
	used := map[string]bool{}
	// Uses in config count inside its exported accessors only.
	for _, f := range cfgFiles {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() || consumerExceptions[fd.Name.Name] || fd.Body == nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok {
					if v, ok := cfgInfo.Uses[id].(*types.Var); ok && fieldName[v] != "" {
						used[fieldName[v]] = true
					}
				}
				return true
			})
		}
	}
	// The module's other packages that import config: checked against
	// config's export data, whose fields are other objects than those of
	// the source check, so they are matched by name.
	byName := map[string]bool{}
	for _, n := range fieldName {
		byName[n] = true
	}
	checked := 0
	for _, path := range order {
		p := pkgs[path]
		if p.Standard || path == "sluice/config" || !strings.HasPrefix(path, "sluice/") || !importsConfig(p) {
			continue
		}
		_, info, _, err := check(p, types.Config{Importer: importerFor(p, imp)})
		if err != nil {
			return nil, err
		}
		checked++
		for _, obj := range info.Uses {
			v, ok := obj.(*types.Var)
			if !ok || !v.IsField() || v.Pkg() == nil || v.Pkg().Path() != "sluice/config" {
				continue
			}
			if n := ownerOf(v) + "." + v.Name(); byName[n] {
				used[n] = true
			}
		}
	}
	if checked < 5 {
		return nil, fmt.Errorf("only %d packages import sluice/config: the package list is wrong", checked)
	}
	sorted := make([]string, 0, len(used))
	for n := range used {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	t.Logf("%d fields of config's types are read", len(sorted))
	return used, nil
}

func importsConfig(p *goPackage) bool {
	for _, i := range p.Imports {
		if i == "sluice/config" {
			return true
		}
	}
	return false
}

// importerFor maps p's import paths as go list does (vendoring, test
// variants) before importing.
func importerFor(p *goPackage, imp types.ImporterFrom) types.Importer {
	return importerFunc(func(path string) (*types.Package, error) {
		if m, ok := p.ImportMap[path]; ok {
			path = m
		}
		return imp.ImportFrom(path, p.Dir, 0)
	})
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// ownerOf names the struct type of config that declares field v, found
// through the package scope of v's package.
func ownerOf(v *types.Var) string {
	scope := v.Pkg().Scope()
	for _, name := range scope.Names() {
		tn, ok := scope.Lookup(name).(*types.TypeName)
		if !ok {
			continue
		}
		st, ok := tn.Type().Underlying().(*types.Struct)
		if !ok {
			continue
		}
		for i := range st.NumFields() {
			if st.Field(i) == v {
				return name
			}
		}
	}
	return ""
}
