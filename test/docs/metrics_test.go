package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// root is the repository, relative to this package.
const root = "../.."

var metricName = regexp.MustCompile(`\bsluice_[a-z0-9_]*[a-z0-9]\b`)

// TestDocMetricsAreDefined fails when the documentation names a metric the
// code does not define (as docs/performance.md once named
// sluice_collector_refused_total for sluice_collector_sessions_refused_total).
// Defined names are the sluice_* string literals of the non-test Go code
// that are given to something (a metric's options, a helper that makes
// one, a constant), not those only compared with or looked up by (readers
// of metrics, such as the UI's health page). A histogram's _bucket, _sum
// and _count series count as defined with it.
func TestDocMetricsAreDefined(t *testing.T) {
	defined := definedMetrics(t)
	if len(defined) < 50 {
		t.Fatalf("only %d metric names found in the code: the scan is broken", len(defined))
	}
	docs := documentedMetrics(t)
	if len(docs) < 50 {
		t.Fatalf("only %d metric names found in the docs: the scan is broken", len(docs))
	}
	names := make([]string, 0, len(docs))
	for n := range docs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if defined[n] {
			continue
		}
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if base != n && defined[base] {
			continue
		}
		t.Errorf("%s names metric %s, which the code does not define", strings.Join(docs[n], ", "), n)
	}
}

// documentedMetrics maps each metric name in the Markdown files to the
// files naming it. A name ending in "_" (a prefix: "sluice_ui_*") is not
// a metric.
func documentedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		seen := map[string]bool{}
		for _, m := range metricName.FindAllString(string(b), -1) {
			if !seen[m] {
				seen[m] = true
				out[m] = append(out[m], rel)
			}
		}
	}
	return out
}

// definedMetrics collects the sluice_* literals of the module's non-test
// Go files that are not operands of a comparison, a switch case or an
// index (how code reads a metric by name).
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	defined := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		readers := map[*ast.BasicLit]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				markLit(readers, n.X)
				markLit(readers, n.Y)
			case *ast.CaseClause:
				for _, e := range n.List {
					markLit(readers, e)
				}
			case *ast.IndexExpr:
				markLit(readers, n.Index)
			}
			return true
		})
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING || readers[lit] {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && metricName.FindString(s) == s {
				defined[s] = true
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return defined
}

func markLit(m map[*ast.BasicLit]bool, e ast.Expr) {
	if lit, ok := ast.Unparen(e).(*ast.BasicLit); ok {
		m[lit] = true
	}
}
