package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Load reads the configuration file at path, applies defaults and
// validates it with the default [ValidateOptions]. See [Parse].
func Load(path string) (*Aggregator, error) {
	return LoadWith(path, ValidateOptions{})
}

// LoadWith is Load validating with opts.
func LoadWith(path string, opts ValidateOptions) (*Aggregator, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return ParseWith(data, path, opts)
}

// Parse decodes a configuration, applies defaults and validates it with
// the default [ValidateOptions]. name is the file name used in errors.
//
// The error, if any, lists every problem found (it is an errors.Join of
// *FieldError and *UnknownKeyError values, one per line of text, ordered by
// line in the file); the configuration is then nil.
func Parse(data []byte, name string) (*Aggregator, error) {
	return ParseWith(data, name, ValidateOptions{})
}

// ParseWith is Parse validating with opts.
func ParseWith(data []byte, name string, opts ValidateOptions) (*Aggregator, error) {
	a, errs := decode(data, name)
	if a == nil {
		return nil, joinSorted(errs)
	}
	errs = append(errs, a.validate(opts)...)
	if len(errs) > 0 {
		return nil, joinSorted(errs)
	}
	return a, nil
}

// Decode is Parse without validation, for a caller that validates with
// options of its own ([Aggregator.Validate]). Errors are those of decoding
// only: YAML syntax, unknown and repeated keys, values of the wrong type.
func Decode(data []byte, name string) (*Aggregator, error) {
	a, errs := decode(data, name)
	if len(errs) > 0 {
		return nil, joinSorted(errs)
	}
	return a, nil
}

// decode returns the configuration and the problems found. The
// configuration is nil only when the YAML itself cannot be read; otherwise
// keys that failed to decode keep their defaults, so that validation can
// still report on the rest.
func decode(data []byte, name string) (*Aggregator, []error) {
	a := Default()
	a.source = name
	a.lines = map[string]int{}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		a.applyDefaults()
		return a, nil
	case err != nil:
		return nil, []error{syntaxError(name, err)}
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, []error{syntaxError(name, err)}
	default:
		return nil, []error{&FieldError{File: name, Line: extra.Line,
			Msg: "a second YAML document; the file must hold one"}}
	}

	d := &decoder{file: name, lines: a.lines, keys: keyPaths(reflect.TypeOf(a).Elem(), "")}
	if len(doc.Content) > 0 {
		d.section(doc.Content[0], reflect.ValueOf(a).Elem(), "")
	}
	a.applyDefaults()
	return a, d.errs
}

// syntaxError turns the YAML library's "yaml: line N: text" into our
// "FILE:N: invalid YAML: text".
func syntaxError(file string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, text, ok := strings.Cut(rest, ": "); ok {
			if n, convErr := strconv.Atoi(num); convErr == nil {
				line, msg = n, text
			}
		}
	}
	return &FieldError{File: file, Line: line, Msg: "invalid YAML: " + msg}
}

// joinSorted joins errors ordered by line, those without a line last.
func joinSorted(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	sort.SliceStable(errs, func(i, j int) bool {
		li, lj := errorLine(errs[i]), errorLine(errs[j])
		if li == 0 || lj == 0 {
			return lj == 0 && li != 0
		}
		return li < lj
	})
	return errors.Join(errs...)
}

// decoder walks the YAML node tree alongside the Aggregator struct, so that
// every key can be checked against the struct's yaml tags and its line
// recorded. Values are decoded one key at a time, so one bad value does not
// hide the others.
type decoder struct {
	file  string
	lines map[string]int
	keys  []string // every known key path, for suggestions
	errs  []error
}

func (d *decoder) fail(key string, line int, format string, args ...any) {
	d.errs = append(d.errs, &FieldError{File: d.file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...)})
}

// section decodes a mapping node into the struct v; path is the key path
// of the mapping ("" at the top).
func (d *decoder) section(n *yaml.Node, v reflect.Value, path string) {
	n = resolveAlias(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.fail(path, n.Line, "expected a mapping of keys, found %s", describe(n))
		return
	}
	fields := fieldsOf(v.Type())
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := resolveAlias(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(path, k.Line, "expected a key name, found %s", describe(k))
			continue
		}
		key := joinKey(path, k.Value)
		if k.ShortTag() == "!!merge" {
			d.fail(path, k.Line, "merge keys (<<) are not supported")
			continue
		}
		if first, ok := seen[k.Value]; ok {
			d.fail(key, k.Line, "key repeated (first at line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		f, ok := findField(fields, k.Value)
		if !ok {
			d.errs = append(d.errs, &UnknownKeyError{File: d.file, Line: k.Line, Key: key,
				Suggestion: d.suggest(k.Value, path, fields)})
			continue
		}
		d.lines[key] = k.Line
		d.value(val, v.Field(f.index), key, k.Line)
	}
}

// value decodes the node of one key into fv.
func (d *decoder) value(n *yaml.Node, fv reflect.Value, key string, line int) {
	n = resolveAlias(n)
	if u, ok := fv.Addr().Interface().(yaml.Unmarshaler); ok {
		if err := u.UnmarshalYAML(n); err != nil {
			d.errs = append(d.errs, &FieldError{File: d.file, Line: line, Key: key, Err: err})
		}
		return
	}
	switch {
	case fv.Kind() == reflect.Struct:
		d.section(n, fv, key)
	case fv.Kind() == reflect.Slice && fv.Type().Elem().Kind() == reflect.Struct:
		if isNull(n) {
			fv.SetZero()
			return
		}
		if n.Kind != yaml.SequenceNode {
			d.fail(key, line, "expected a list, found %s", describe(n))
			return
		}
		if len(n.Content) == 0 {
			fv.SetZero()
			return
		}
		s := reflect.MakeSlice(fv.Type(), len(n.Content), len(n.Content))
		for i, e := range n.Content {
			ek := fmt.Sprintf("%s[%d]", key, i)
			d.lines[ek] = e.Line
			d.section(e, s.Index(i), ek)
		}
		fv.Set(s)
	default:
		if isNull(n) {
			return // keep the default
		}
		// Decode into a fresh value so that a failure leaves the default.
		tmp := reflect.New(fv.Type())
		if err := n.Decode(tmp.Interface()); err != nil {
			if n.Kind == yaml.ScalarNode {
				d.fail(key, line, "%s is not %s", describe(n), expectedType(fv.Type()))
			} else {
				d.fail(key, line, "expected %s, found %s", expectedType(fv.Type()), describe(n))
			}
			return
		}
		if tmp.Elem().Kind() == reflect.Slice && tmp.Elem().Len() == 0 {
			fv.SetZero() // an empty list is no list
			return
		}
		fv.Set(tmp.Elem())
	}
}

// suggest returns the key path probably meant by the unknown key name under
// path: a sibling within a few typos, else the one key elsewhere with that
// very name (such as "sluice.ipfixAddress" for a top-level "ipfixAddress").
func (d *decoder) suggest(name, path string, fields []field) string {
	lname := strings.ToLower(name)
	best, bestDist := "", -1
	for _, f := range fields {
		dist := editDistance(lname, strings.ToLower(f.name))
		if dist <= typoBudget(f.name) && (bestDist < 0 || dist < bestDist) {
			best, bestDist = f.name, dist
		}
	}
	if best != "" {
		return joinKey(path, best)
	}
	var found []string
	for _, k := range d.keys {
		last := k[strings.LastIndexByte(k, '.')+1:]
		if strings.EqualFold(last, name) && k != joinKey(path, name) {
			found = append(found, k)
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return ""
}

// typoBudget is how many edits separate a typo from the key name: 1 for
// short names, up to 3 for long ones.
func typoBudget(name string) int {
	return min(1+len(name)/5, 3)
}

// editDistance is the optimal-string-alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent characters
// each cost one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// Three rows: two back (for swaps), previous, current.
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

// field is one YAML key of a struct.
type field struct {
	name  string
	index int
}

// fieldsOf lists the YAML keys of struct type t, in declaration order.
func fieldsOf(t reflect.Type) []field {
	var fs []field
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		fs = append(fs, field{name: name, index: i})
	}
	return fs
}

func findField(fs []field, name string) (field, bool) {
	for _, f := range fs {
		if f.name == name {
			return f, true
		}
	}
	return field{}, false
}

// keyPaths lists every key path of struct type t, sections included.
// Elements of lists are not descended into.
func keyPaths(t reflect.Type, prefix string) []string {
	var out []string
	for _, f := range fieldsOf(t) {
		key := joinKey(prefix, f.name)
		out = append(out, key)
		ft := t.Field(f.index).Type
		if ft.Kind() == reflect.Struct && !isLeaf(ft) {
			out = append(out, keyPaths(ft, key)...)
		}
	}
	return out
}

// isLeaf reports whether values of struct type t decode themselves.
func isLeaf(t reflect.Type) bool {
	return reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]())
}

func joinKey(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// describe names what a node holds, for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return "nothing"
}

// expectedType names what a Go type accepts, for messages.
func expectedType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return expectedType(t.Elem())
	case reflect.Bool:
		return "a boolean (true or false)"
	case reflect.String:
		return "a string"
	case reflect.Int:
		return "an integer"
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("an integer from %d to %d", -1<<(t.Bits()-1), 1<<(t.Bits()-1)-1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("an integer from 0 to %d", uint64(1)<<t.Bits()-1)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return "a list of strings"
		}
		return "a list"
	}
	return "a " + t.String()
}

// Duration is a span of time written as a Go duration string: "60s",
// "1m30s", "500ms". In a YAML file an empty value (or null) leaves the
// default in place.
type Duration struct {
	time.Duration
}

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	n = resolveAlias(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("expected a duration such as \"60s\", found %s", describe(n))
	}
	s := strings.TrimSpace(n.Value)
	if s == "" {
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration: %w (write it like \"60s\" or \"1m30s\")", err)
	}
	d.Duration = v
	return nil
}

// MarshalYAML writes the duration as a Go duration string.
func (d Duration) MarshalYAML() (any, error) {
	return d.String(), nil
}
