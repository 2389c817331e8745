package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"sigs.k8s.io/yaml"

	"sluice/demo"
	"sluice/traceflow/cluster"
	"sluice/traceflow/render"
)

// The web UI's tests drive Debian's Chromium headless (chromedp) against
// a running demo pipeline on loopback. Without Chromium they skip, or
// fail with SLUICE_REQUIRE_PEERS=1 (as `make test` sets).

// chromiumPath finds Chromium.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("SLUICE_REQUIRE_PEERS") == "1" {
		t.Fatal("Chromium is required (SLUICE_REQUIRE_PEERS=1) but not installed: apt-get install chromium (scripts/install-deps.sh)")
	}
	t.Skip("Chromium not installed; set SLUICE_REQUIRE_PEERS=1 to make this a failure")
	return ""
}

// screenshotDir is where the tests save screenshots:
// $SLUICE_UI_SCREENSHOTS (`make ui-screenshots` sets docs/ui), else a
// directory under the system's temporary one.
func screenshotDir(t *testing.T) string {
	dir := os.Getenv("SLUICE_UI_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "sluice-ui-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser is one headless Chromium with a tab, and what the tab's pages
// reported as errors.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

// newBrowser starts Chromium with a viewport of width × height (a phone's
// when narrow), with the flags that keep it off the network, and extra.
func newBrowser(t *testing.T, width, height int64, extra ...chromedp.ExecAllocatorOption) *browser {
	t.Helper()
	path := chromiumPath(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(int(width), int(height)),
	}
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &browser{ctx: ctx}
	var viewport []chromedp.EmulateViewportOption
	if width < 600 {
		viewport = append(viewport, chromedp.EmulateMobile, chromedp.EmulateTouch)
	}
	// The first run starts the browser: no timeout on it.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height, viewport...)); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("starting Chromium: %v", err)
	}
	// Console errors, exceptions and the browser log's errors (a failed
	// load, a refused resource) are the pages' errors.
	msgs := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.mu.Lock()
				b.errs = append(b.errs, m.String()+" "+m.URL)
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cancelAlloc() })
	return b
}

// errors returns, and forgets, what the pages reported as errors.
func (b *browser) errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.errs
	b.errs = nil
	return e
}

// run runs actions with a bound.
func (b *browser) run(t *testing.T, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// waitJS polls a JavaScript expression until it is true.
func (b *browser) waitJS(t *testing.T, timeout time.Duration, expr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		state, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.hash + " | " + document.querySelector("main").innerText.slice(0, 600)`))
		t.Fatalf("waiting for %s: %v\npage: %s", expr, err, state)
	}
}

// pollJS is waitJS that reports instead of failing the test.
func (b *browser) pollJS(timeout time.Duration, expr string) bool {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond)))
	return err == nil
}

// eval evaluates expr into out (JSON).
func (b *browser) eval(t *testing.T, expr string, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
}

func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(screenshotDir(t), name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", p)
}

// startDemo runs `sluice demo --duration 0` in the process and returns its
// web UI's URL; the demo stops when the test ends.
func startDemo(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := demo.Run(ctx, demo.Options{UntilInterrupted: true, UIAddress: "127.0.0.1:0", Rate: 100, Stdout: &out})
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("demo: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Error("the demo did not stop")
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if line, _, ok := strings.Cut(out.String(), "\n"); ok {
			u, found := strings.CutPrefix(line, "web UI: ")
			if !found {
				t.Fatalf("the demo's first line is not its web UI's URL: %q", line)
			}
			return u
		}
		select {
		case err := <-done:
			t.Fatalf("the demo stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the demo printed no URL")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitMap polls the UI's map until it holds a denied edge and an Egress.
func waitMap(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var g struct {
			Endpoints []struct{ Kind string } `json:"endpoints"`
			Edges     []struct{ Denied int }  `json:"edges"`
		}
		resp, err := http.Get(base + "api/map")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&g)
			resp.Body.Close()
		}
		denied, egress := false, false
		for _, e := range g.Edges {
			denied = denied || e.Denied > 0
		}
		for _, e := range g.Endpoints {
			egress = egress || e.Kind == "egress"
		}
		if denied && egress {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the map has no denied edge (%v) or no Egress (%v) yet: %v", denied, egress, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// pageReady is, per page, a condition that holds once it shows its data.
var pageReady = map[string]string{
	"flows":     `document.querySelectorAll('.tbody [role=row]').length > 0`,
	"map":       `!!window.sluiceMap && window.sluiceMap.edges().length > 0 && document.querySelectorAll('table.edges tbody tr').length > 0`,
	"traceflow": `document.querySelectorAll('#tf-pods option').length > 0`,
	"policies":  `document.querySelectorAll('#pol-ns option').length > 1`,
	"health":    `document.querySelectorAll('#exporters tbody tr').length >= 3`,
}

var pageOrder = []string{"flows", "map", "traceflow", "policies", "health"}

// labelled checks that every control has an accessible name.
const unlabelled = `(() => {
  const bad = []
  for (const el of document.querySelectorAll('input, select, textarea')) {
    if (el.type === 'hidden') continue
    if (el.labels.length === 0 && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby')) bad.push(el.outerHTML.slice(0, 120))
  }
  for (const el of document.querySelectorAll('button, a[href]')) {
    if (!el.textContent.trim() && !el.getAttribute('aria-label')) bad.push(el.outerHTML.slice(0, 120))
  }
  return bad
})()`

func TestUIInBrowser(t *testing.T) {
	chromiumPath(t)
	base := startDemo(t)
	waitMap(t, base)
	b := newBrowser(t, 1280, 800)

	t.Run("pages", func(t *testing.T) {
		for _, p := range pageOrder {
			b.run(t, 30*time.Second, chromedp.Navigate(base+"#/"+p))
			b.waitJS(t, 90*time.Second, pageReady[p])
			var bad []string
			b.eval(t, unlabelled, &bad)
			if len(bad) > 0 {
				t.Errorf("%s: controls without a label: %v", p, bad)
			}
			var title string
			b.eval(t, `document.querySelector('main h1').textContent + '|' + document.querySelector('nav a[aria-current=page]').textContent`, &title)
			if want := map[string]string{"flows": "Flows|Flows", "map": "Map|Map", "traceflow": "Traceflow|Traceflow", "policies": "Policies|Policies", "health": "Health|Health"}[p]; title != want {
				t.Errorf("%s: heading and current link %q, want %q", p, title, want)
			}
			b.screenshot(t, p)
			if errs := b.errors(); len(errs) > 0 {
				t.Errorf("%s: the page reported errors: %v", p, errs)
			}
		}
	})

	t.Run("flows", func(t *testing.T) {
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/flows"))
		b.waitJS(t, 60*time.Second, pageReady["flows"])
		// Rows name both Pods.
		b.waitJS(t, 60*time.Second, `[...document.querySelectorAll('.tbody [role=row]')].some(r => /^[a-z-]+\/[a-z0-9-]+$/.test(r.children[1].textContent) && /^[a-z-]+\/[a-z0-9-]+$/.test(r.children[3].textContent))`)
		// Filter by Pod, typed.
		b.run(t, 30*time.Second, chromedp.SendKeys(chromedp.CSS(`input[name=pod]`), "frontend-1"))
		b.waitJS(t, 30*time.Second, `(() => { const rows = [...document.querySelectorAll('.tbody [role=row]')]; return rows.length > 0 && rows.every(r => r.children[1].textContent.includes('frontend-1') || r.children[3].textContent.includes('frontend-1')) })()`)
		var hash string
		b.eval(t, `location.hash`, &hash)
		if hash != "#/flows?pod=frontend-1" {
			t.Errorf("the filter is not in the address: %q", hash)
		}
		// Filters from the address: denied TCP records.
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/flows?action=Drop&proto=TCP"))
		b.waitJS(t, 60*time.Second, `(() => { const rows = [...document.querySelectorAll('.tbody [role=row]')]; return rows.length > 0 && rows.every(r => r.children[11].textContent === 'Drop' && r.children[6].textContent === 'TCP' && r.classList.contains('denied')) })()`)
		b.waitJS(t, 5*time.Second, `document.querySelector('select[name=action]').value === 'Drop'`)
		// Sort by port, ascending.
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/flows"))
		b.waitJS(t, 60*time.Second, pageReady["flows"])
		b.run(t, 30*time.Second, chromedp.Click(chromedp.CSS(`button[data-key=port]`)))
		b.waitJS(t, 10*time.Second, `document.querySelector('[role=columnheader][data-key=port]').getAttribute('aria-sort') === 'ascending'`)
		b.waitJS(t, 10*time.Second, `(() => { const p = [...document.querySelectorAll('.tbody [role=row]')].map(r => Number(r.children[7].textContent)); return p.length > 1 && p.every((v, i) => i === 0 || p[i-1] <= v) })()`)
		// Pause holds the table still.
		b.run(t, 10*time.Second, chromedp.Click(chromedp.CSS(`button.pause`)))
		b.waitJS(t, 5*time.Second, `document.querySelector('button.pause').getAttribute('aria-pressed') === 'true'`)
		var before, after string
		b.eval(t, `document.getElementById('flow-count').textContent`, &before)
		b.waitJS(t, 30*time.Second, `/Paused \([1-9]/.test(document.getElementById('flow-status').textContent)`)
		b.eval(t, `document.getElementById('flow-count').textContent`, &after)
		if before != after {
			t.Errorf("paused, the table changed: %s → %s rows", before, after)
		}
		b.run(t, 10*time.Second, chromedp.Click(chromedp.CSS(`button.pause`)))
		b.waitJS(t, 10*time.Second, fmt.Sprintf(`document.getElementById('flow-count').textContent !== %q`, after))
		// A row opens its every field.
		b.run(t, 10*time.Second, chromedp.Click(chromedp.CSS(`.tbody [role=row]`)))
		b.waitJS(t, 30*time.Second, `!document.querySelector('.details').hidden && document.querySelectorAll('.all-fields dt').length >= 20`)
		b.screenshot(t, "flows-record")
		b.run(t, 10*time.Second, chromedp.KeyEvent(kb.Escape))
		b.waitJS(t, 5*time.Second, `document.querySelector('.details').hidden`)
	})

	t.Run("map", func(t *testing.T) {
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/map"))
		b.waitJS(t, 60*time.Second, pageReady["map"])
		b.waitJS(t, 60*time.Second, `sluiceMap.edges('[denied > 0]').length > 0 && sluiceMap.nodes('[kind = "egress"]').length > 0 && sluiceMap.nodes('[kind = "external"]').length > 0`)
		var style struct {
			Denied, Allowed string
		}
		b.eval(t, `({Denied: sluiceMap.edges('[denied > 0]')[0].style('line-style'), Allowed: sluiceMap.edges('[denied = 0]')[0].style('line-style')})`, &style)
		if style.Denied != "dashed" || style.Allowed != "solid" {
			t.Errorf("denied edges are not drawn differently: %+v", style)
		}
		// Grouping by namespace makes fewer nodes than by Pod.
		var byNS, byPod int
		b.run(t, 10*time.Second, chromedp.SetValue(chromedp.CSS(`select[name=group]`), "ns"),
			chromedp.Evaluate[chromedp.Void](`document.querySelector('select[name=group]').dispatchEvent(new Event('change'))`))
		b.eval(t, `sluiceMap.nodes('[kind = "pod"]').length`, &byNS)
		b.run(t, 10*time.Second, chromedp.SetValue(chromedp.CSS(`select[name=group]`), "pod"),
			chromedp.Evaluate[chromedp.Void](`document.querySelector('select[name=group]').dispatchEvent(new Event('change'))`))
		b.eval(t, `sluiceMap.nodes('[kind = "pod"]').length`, &byPod)
		if byNS == 0 || byNS >= byPod {
			t.Errorf("namespaces %d nodes, Pods %d", byNS, byPod)
		}
		// Freeze the map, click a Pod-to-Pod edge where it is drawn: the
		// Flows page opens, filtered to it.
		b.run(t, 10*time.Second, chromedp.Click(chromedp.CSS(`button.freeze`)))
		b.waitJS(t, 5*time.Second, `document.querySelector('button.freeze').getAttribute('aria-pressed') === 'true'`)
		// The point clicked is one where the map's own hit test finds a
		// Pod-to-Pod edge and nothing of the page lies on top of it: the
		// middle of the busiest edge can be under a Pod of a dense
		// layout. On a loaded machine the map may still be drawing when
		// the click lands: it is tried again a few times.
		for try := 1; ; try++ {
			var opened bool
			if b.eval(t, `location.hash.startsWith('#/flows?from=')`, &opened); opened {
				break // the last click took effect late
			}
			var at struct {
				X, Y  float64
				Edge  string
				Found bool
			}
			b.eval(t, edgePointJS, &at)
			if !at.Found {
				t.Fatalf("no Pod-to-Pod edge of the map can be clicked without hitting something else")
			}
			b.run(t, 10*time.Second, chromedp.MouseClickXY(at.X, at.Y))
			if b.pollJS(5*time.Second, `location.hash.startsWith('#/flows?from=')`) {
				break
			}
			var seen string
			b.eval(t, fmt.Sprintf(`(() => { const el = document.elementFromPoint(%v, %v); return (el ? el.tagName + '.' + el.className : 'nothing') + ' at the point; hash ' + location.hash })()`, at.X, at.Y), &seen)
			t.Logf("click %d on the edge %s at (%.0f, %.0f) did not open it: %s", try, at.Edge, at.X, at.Y, seen)
			if try == 4 {
				b.waitJS(t, 10*time.Second, `location.hash.startsWith('#/flows?from=')`)
				break
			}
		}
		b.waitJS(t, 60*time.Second, `document.querySelectorAll('.tbody [role=row]').length > 0`)
		var edge struct {
			Want  []string
			Pairs [][3]string
		}
		// The edge clicked (another may cross the chosen one's middle).
		b.eval(t, `({Want: (q => [q.get('from'), q.get('to')])(new URLSearchParams(location.hash.split('?')[1])),
		  Pairs: [...document.querySelectorAll('.tbody [role=row]')].map(r => [r.children[1].textContent, r.children[3].textContent, r.children[12].textContent])})`, &edge)
		// An end matches a row's Pod or address, or its Egress.
		ends := func(id, cell, egress string) bool {
			kind, name, _ := strings.Cut(id, ":")
			switch kind {
			case "pod", "ip":
				return cell == name
			case "egress":
				n, ip, _ := strings.Cut(name, "/")
				return egress == n+" ("+ip+")"
			}
			return false
		}
		if len(edge.Want) != 2 || !strings.HasPrefix(edge.Want[0], "pod:") && !strings.HasPrefix(edge.Want[0], "egress:") {
			t.Fatalf("the click opened the edge %v", edge.Want)
		}
		for _, p := range edge.Pairs {
			if !ends(edge.Want[0], p[0], p[2]) || !ends(edge.Want[1], p[1], p[2]) {
				t.Errorf("the edge %v's Flows page shows a row %v", edge.Want, p)
			}
		}
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/map"))
		b.waitJS(t, 60*time.Second, pageReady["map"])
		b.screenshot(t, "map")
		if errs := b.errors(); len(errs) > 0 {
			t.Errorf("the page reported errors: %v", errs)
		}
	})

	t.Run("traceflow", func(t *testing.T) {
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/traceflow"))
		b.waitJS(t, 60*time.Second, pageReady["traceflow"])
		b.run(t, 30*time.Second,
			chromedp.SendKeys(chromedp.CSS(`#tf-src`), "batch/crawler-0"),
			chromedp.SendKeys(chromedp.CSS(`#tf-dst`), "198.51.100.7"),
			chromedp.SetValue(chromedp.CSS(`#tf-proto`), "tcp"),
			chromedp.Evaluate[chromedp.Void](`document.querySelector('#tf-proto').dispatchEvent(new Event('change'))`),
			chromedp.SendKeys(chromedp.CSS(`#tf-dport`), "443"),
			chromedp.Click(chromedp.CSS(`.trace-form button[type=submit]`)))
		b.waitJS(t, 90*time.Second, `!!document.getElementById('tf-yaml')`)
		var page struct {
			YAML  string
			Cmd   string
			Lanes []struct {
				Node string
				Obs  [][2]string
			}
		}
		b.eval(t, `({YAML: document.getElementById('tf-yaml').textContent, Cmd: document.getElementById('tf-cmd').textContent,
		  Lanes: [...document.querySelectorAll('.lane')].map(l => ({Node: l.querySelector('.node-name').textContent,
		    Obs: [...l.querySelectorAll('.obs')].map(o => [o.dataset.component, o.dataset.action])}))})`, &page)
		want, stderr, code := runSluice(t, "traceflow", "-S", "batch/crawler-0", "-D", "198.51.100.7", "-f", "tcp,tcp_dst=443", "--cluster", "../../examples/cluster")
		if code != 0 {
			t.Fatalf("sluice traceflow: %s", stderr)
		}
		if normalizeTrace(page.YAML) != normalizeTrace(want) {
			t.Errorf("the page's YAML is not the command's:\n--- page\n%s\n--- command\n%s", page.YAML, want)
		}
		var sum render.Summary
		if err := yaml.Unmarshal([]byte(want), &sum); err != nil {
			t.Fatal(err)
		}
		if len(page.Lanes) != len(sum.Results) || len(sum.Results) < 2 {
			t.Fatalf("the page drew %d Nodes, the command reports %d", len(page.Lanes), len(sum.Results))
		}
		for i, r := range sum.Results {
			l := page.Lanes[i]
			if l.Node != r.Node || len(l.Obs) != len(r.Observations) {
				t.Errorf("Node %d: page %s with %d observations, command %s with %d", i, l.Node, len(l.Obs), r.Node, len(r.Observations))
				continue
			}
			for j, o := range r.Observations {
				if l.Obs[j] != [2]string{string(o.Component), string(o.Action)} {
					t.Errorf("%s observation %d: page %v, command %s %s", r.Node, j, l.Obs[j], o.Component, o.Action)
				}
			}
		}
		if !strings.Contains(page.Cmd, "-S batch/crawler-0 -D 198.51.100.7 -f tcp,tcp_dst=443") {
			t.Errorf("the page's command line: %q", page.Cmd)
		}
		b.screenshot(t, "traceflow")
		if errs := b.errors(); len(errs) > 0 {
			t.Errorf("the page reported errors: %v", errs)
		}
	})

	// The Policies page: recommend from the flows the UI holds, verify
	// (nothing observed blocked), then replace the YAML with a policy that
	// blocks the web namespace's egress and verify again.
	t.Run("policies", func(t *testing.T) {
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/policies?window="))
		b.waitJS(t, 60*time.Second, pageReady["policies"])
		b.run(t, 30*time.Second, chromedp.Click(chromedp.CSS(`#pol-recommend`)))
		b.waitJS(t, 90*time.Second, `!!document.getElementById('pol-counts')`)
		var page struct {
			YAML                        string
			Blocked, Allowed, Unchanged string
			Download                    string
		}
		read := `({YAML: document.getElementById('pol-yaml').value,
		  Blocked: document.querySelector('[data-count=blocked]').textContent,
		  Allowed: document.querySelector('[data-count=allowed]').textContent,
		  Unchanged: document.querySelector('[data-count=unchanged]').textContent,
		  Download: document.getElementById('pol-download').hidden ? '' : document.getElementById('pol-download').href})`
		b.eval(t, read, &page)
		if page.Blocked != "0" || page.Allowed != "0" || page.Unchanged == "0" {
			t.Errorf("the recommendation's verification: %s blocked, %s newly allowed, %s unchanged", page.Blocked, page.Allowed, page.Unchanged)
		}
		objs, err := cluster.ParseObjects([]byte(page.YAML), "page")
		if err != nil || len(objs) < 5 {
			t.Errorf("the page's YAML holds %d objects (%v):\n%s", len(objs), err, page.YAML)
		}
		if !strings.HasPrefix(page.Download, "blob:") {
			t.Errorf("download link %q", page.Download)
		}
		b.screenshot(t, "policies")
		deny := "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: web}\nspec: {podSelector: {}, policyTypes: [Egress]}\n"
		b.run(t, 30*time.Second,
			chromedp.SetValue(chromedp.CSS(`#pol-yaml`), deny),
			chromedp.Evaluate[chromedp.Void](`document.querySelector('#pol-yaml').dispatchEvent(new Event('input'))`),
			chromedp.Click(chromedp.CSS(`#pol-verify`)))
		b.waitJS(t, 90*time.Second, `document.querySelector('[data-count=blocked]')?.textContent !== '0' && !!document.getElementById('pol-blocked')`)
		var rules []string
		b.eval(t, `[...document.querySelectorAll('#pol-blocked tbody tr')].map(r => r.cells[0].textContent + ' ' + r.cells[5].textContent)`, &rules)
		if len(rules) == 0 {
			t.Fatal("no blocked flow listed")
		}
		for _, r := range rules {
			if !strings.HasPrefix(r, "web/") || !strings.Contains(r, "K8sNetworkPolicy:web/deny-all") {
				t.Errorf("blocked flow %q: want a web source blocked by web/deny-all", r)
			}
		}
		b.screenshot(t, "policies-blocked")
		if errs := b.errors(); len(errs) > 0 {
			t.Errorf("the page reported errors: %v", errs)
		}
	})

	t.Run("keyboard", func(t *testing.T) {
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/flows"), chromedp.Reload())
		b.waitJS(t, 60*time.Second, pageReady["flows"])
		active := func() string {
			var s string
			b.eval(t, `(() => { const a = document.activeElement; return a.tagName + '|' + (a.getAttribute('class') || '') + '|' + a.textContent.slice(0, 20) })()`, &s)
			return s
		}
		b.run(t, 10*time.Second, chromedp.KeyEvent(kb.Tab))
		if a := active(); !strings.HasPrefix(a, "A|skip|") {
			t.Errorf("the first Tab reaches %q, want the skip link", a)
		}
		b.run(t, 10*time.Second, chromedp.KeyEvent(kb.Tab), chromedp.KeyEvent(kb.Tab))
		if a := active(); a != "A||Map" {
			t.Errorf("two more Tabs reach %q, want the Map link", a)
		}
		b.run(t, 10*time.Second, chromedp.KeyEvent(kb.Enter))
		b.waitJS(t, 10*time.Second, `location.hash === '#/map' && document.activeElement.tagName === 'H1'`)
		// Back on Flows: the skip link, then into the rows with the
		// arrow keys, Enter opens one, Escape closes it.
		b.run(t, 30*time.Second, chromedp.Navigate(base+"#/flows"))
		b.waitJS(t, 60*time.Second, pageReady["flows"])
		b.run(t, 10*time.Second, chromedp.Click(chromedp.CSS(`button.pause`)),
			chromedp.Focus(chromedp.CSS(`.tbody [role=row][tabindex="0"]`)))
		var first, second int
		b.eval(t, `Number(document.activeElement.getAttribute('aria-rowindex'))`, &first)
		b.run(t, 10*time.Second, chromedp.KeyEvent(kb.ArrowDown))
		b.waitJS(t, 5*time.Second, fmt.Sprintf(`Number(document.activeElement.getAttribute('aria-rowindex')) === %d`, first+1))
		b.eval(t, `Number(document.activeElement.getAttribute('aria-rowindex'))`, &second)
		b.run(t, 10*time.Second, chromedp.KeyEvent(kb.Enter))
		b.waitJS(t, 5*time.Second, `!document.querySelector('.details').hidden && document.activeElement.id === 'details-title'`)
		b.run(t, 10*time.Second, chromedp.KeyEvent(kb.Escape))
		b.waitJS(t, 5*time.Second, fmt.Sprintf(`document.querySelector('.details').hidden && Number(document.activeElement.getAttribute('aria-rowindex')) === %d`, second))
		// The column headers are buttons: Enter sorts.
		b.run(t, 10*time.Second, chromedp.Focus(chromedp.CSS(`button[data-key=bytes]`)), chromedp.KeyEvent(kb.Enter))
		b.waitJS(t, 5*time.Second, `document.querySelector('[role=columnheader][data-key=bytes]').getAttribute('aria-sort') === 'descending'`)
	})

	t.Run("phone", func(t *testing.T) {
		p := newBrowser(t, 390, 844)
		for _, name := range pageOrder {
			p.run(t, 30*time.Second, chromedp.Navigate(base+"#/"+name))
			p.waitJS(t, 60*time.Second, pageReady[name])
			var fit struct{ Page, View float64 }
			p.eval(t, `({Page: document.documentElement.scrollWidth, View: window.innerWidth})`, &fit)
			if fit.Page > 390 {
				t.Errorf("%s: the page is %v px wide in a %v px window", name, fit.Page, fit.View)
			}
			p.screenshot(t, name+"-phone")
			if errs := p.errors(); len(errs) > 0 {
				t.Errorf("%s: the page reported errors: %v", name, errs)
			}
		}
	})
	// DNS rebinding: a page of another name that resolves to the UI's
	// address (Chromium's resolver maps rebind.test to 127.0.0.1) is the
	// browser's same origin as the UI, but the UI refuses it: neither the
	// pages nor the API answer it.
	t.Run("rebinding", func(t *testing.T) {
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		r := newBrowser(t, 1280, 800, chromedp.Flag("host-resolver-rules", "MAP rebind.test 127.0.0.1"))
		for _, path := range []string{"/", "/api/flows"} {
			r.run(t, 30*time.Second, chromedp.Navigate("http://rebind.test:"+u.Port()+path))
			var text string
			r.eval(t, `document.body.innerText`, &text)
			if !strings.Contains(text, `host \"rebind.test:`+u.Port()+`\" is not allowed`) && !strings.Contains(text, `host "rebind.test:`+u.Port()+`" is not allowed`) {
				t.Errorf("rebind.test%s: the page shows %q, want the refusal", path, text)
			}
			if strings.Contains(text, "frontend") {
				t.Errorf("rebind.test%s: the page shows flows: %q", path, text)
			}
		}
	})
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("the pages reported errors: %v", errs)
	}
}

// edgePointJS finds a point of the map to click: on a Pod-to-Pod edge
// (the busiest first), fitted into view, where the map's hit test finds
// that edge and the page has the map's canvas on top. Edges are drawn as
// quadratic Béziers (straight ones too), so the points tried lie on the
// curve through the edge's ends and middle.
const edgePointJS = `(() => {
  const map = sluiceMap, box = document.getElementById('cy'), r = map.renderer();
  const edges = map.edges().filter(e => e.source().data('kind') === 'pod' && e.target().data('kind') === 'pod').sort((a, b) => b.data('bps') - a.data('bps'));
  for (const e of edges.slice(0, 10)) {
    map.fit(e, 150);
    const s = e.renderedSourceEndpoint(), t = e.renderedTargetEndpoint(), m = e.renderedMidpoint();
    const c = {x: 2 * m.x - (s.x + t.x) / 2, y: 2 * m.y - (s.y + t.y) / 2};
    const rect = box.getBoundingClientRect(), pan = map.pan(), zoom = map.zoom();
    for (const f of [0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8]) {
      const x = (1 - f) * (1 - f) * s.x + 2 * f * (1 - f) * c.x + f * f * t.x;
      const y = (1 - f) * (1 - f) * s.y + 2 * f * (1 - f) * c.y + f * f * t.y;
      const hit = r.findNearestElement((x - pan.x) / zoom, (y - pan.y) / zoom, true, false);
      const X = rect.left + box.clientLeft + x, Y = rect.top + box.clientTop + y;
      if (!hit || hit.id() !== e.id() || X < 0 || Y < 0 || X >= innerWidth || Y >= innerHeight) continue;
      const top = document.elementFromPoint(X, Y);
      if (top && box.contains(top)) return {X, Y, Edge: e.id(), Found: true};
    }
  }
  return {Found: false};
})()`
