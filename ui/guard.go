package ui

import (
	"net"
	"net/http"
	"strconv"
	"strings"
)

// The UI has no login: it is meant for loopback or kubectl port-forward.
// Two checks keep a web page the user's browser opens elsewhere from
// using it:
//
//   - DNS rebinding: a page of evil.example whose name is made to resolve
//     to 127.0.0.1 reaches the UI as if it were same-origin, but its
//     requests say "Host: evil.example". Requests are served only when
//     their Host is a loopback name or address, the host of the address
//     the UI listens on, or one of Options.AllowedHosts.
//   - Cross-origin requests: a page may send a POST anywhere (a "simple"
//     request needs no preflight). Requests other than GET, HEAD and
//     OPTIONS are refused when the browser says they come from another
//     origin (Sec-Fetch-Site, or an Origin header that is not the Host;
//     net/http's CrossOriginProtection).

// hostGuard is the set of Host header values the UI answers.
type hostGuard struct {
	// hosts are allowed names or addresses, any port; hostPorts are
	// allowed host:port pairs (entries of AllowedHosts with a port). Both
	// are lower case, without brackets or a trailing dot.
	hosts     map[string]bool
	hostPorts map[string]bool
}

// newHostGuard allows loopback, the host of listen (when it names one:
// not empty, not 0.0.0.0 or ::), and extra (host or host:port each).
func newHostGuard(listen string, extra []string) *hostGuard {
	g := &hostGuard{hosts: map[string]bool{"localhost": true}, hostPorts: map[string]bool{}}
	if listen != "" {
		host := listen
		if h, _, err := net.SplitHostPort(listen); err == nil {
			host = h
		}
		if ip := net.ParseIP(normHost(host)); host != "" && (ip == nil || !ip.IsUnspecified()) {
			g.hosts[normHost(host)] = true
		}
	}
	for _, e := range extra {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if h, p, err := net.SplitHostPort(e); err == nil {
			g.hostPorts[net.JoinHostPort(normHost(h), p)] = true
			continue
		}
		g.hosts[normHost(e)] = true
	}
	return g
}

// normHost is a host as the guard compares it: lower case, without
// brackets or a trailing dot, an IP address in its canonical form.
func normHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")), ".")
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return h
}

// allowed says whether a request's Host header names the UI.
func (g *hostGuard) allowed(hostHeader string) bool {
	if hostHeader == "" {
		return false
	}
	host, port, err := net.SplitHostPort(hostHeader)
	if err != nil {
		host, port = hostHeader, ""
	}
	host = normHost(host)
	if host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	if g.hosts[host] {
		return true
	}
	return port != "" && g.hostPorts[net.JoinHostPort(host, port)]
}

// guard wraps the UI's handler in both checks.
func (s *Server) guard(h http.Handler) http.Handler {
	g := newHostGuard(s.o.Address, s.o.AllowedHosts)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.m.Refused.WithLabelValues(RefusedCrossOrigin).Inc()
		s.o.Log.Warn("web UI: refused a cross-origin request", "method", r.Method, "path", r.URL.Path,
			"origin", r.Header.Get("Origin"), "host", r.Host, "remote", r.RemoteAddr)
		refuse(w, r, http.StatusForbidden, "cross-origin request refused: "+r.Method+" "+r.URL.Path+
			" comes from another origin ("+originOf(r)+"), not from the Sluice UI at "+r.Host)
	}))
	return cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.allowed(r.Host) {
			s.m.Refused.WithLabelValues(RefusedHost).Inc()
			s.o.Log.Warn("web UI: refused a request for a host it does not serve", "host", r.Host,
				"path", r.URL.Path, "remote", r.RemoteAddr)
			refuse(w, r, http.StatusMisdirectedRequest, "host "+strconv.Quote(r.Host)+
				" is not allowed: the Sluice UI answers only requests for localhost, a loopback address "+
				"or the host it listens on, which protects it from DNS rebinding. Open it as http://localhost:PORT/ "+
				"(kubectl port-forward), or add the name to sluice.ui.allowedHosts.")
			return
		}
		h.ServeHTTP(w, r)
	}))
}

func originOf(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" {
		return "Origin " + o
	}
	return "Sec-Fetch-Site " + r.Header.Get("Sec-Fetch-Site")
}

// refuse answers a refused request: JSON for the API, text for pages.
func refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if strings.HasPrefix(r.URL.Path, "/api/") {
		writeError(w, status, msg)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}
