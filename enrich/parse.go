package enrich

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The subset of the Kubernetes object schema that the inventory reads. Spec
// and status are unions of the Pod, Node and Service fields used: their
// names do not overlap.
type (
	k8sObject struct {
		APIVersion string       `json:"apiVersion"`
		Kind       string       `json:"kind"`
		Metadata   k8sMeta      `json:"metadata"`
		Spec       k8sSpec      `json:"spec"`
		Status     k8sStatus    `json:"status"`
		Items      []*k8sObject `json:"items"`
	}
	k8sMeta struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		UID               string            `json:"uid"`
		CreationTimestamp string            `json:"creationTimestamp"`
		Labels            map[string]string `json:"labels"`
		OwnerReferences   []k8sOwnerRef     `json:"ownerReferences"`
	}
	k8sOwnerRef struct {
		Kind       string `json:"kind"`
		Name       string `json:"name"`
		Controller bool   `json:"controller"`
	}
	k8sSpec struct {
		NodeName    string           `json:"nodeName"`    // Pod
		HostNetwork bool             `json:"hostNetwork"` // Pod
		PodCIDR     string           `json:"podCIDR"`     // Node
		PodCIDRs    []string         `json:"podCIDRs"`    // Node
		ClusterIP   string           `json:"clusterIP"`   // Service
		ClusterIPs  []string         `json:"clusterIPs"`  // Service
		Ports       []k8sServicePort `json:"ports"`       // Service
	}
	k8sServicePort struct {
		Name     string `json:"name"`
		Protocol string `json:"protocol"`
		Port     int    `json:"port"`
	}
	k8sStatus struct {
		Phase             string               `json:"phase"`             // Pod
		ContainerStatuses []k8sContainerStatus `json:"containerStatuses"` // Pod
		PodIP             string               `json:"podIP"`             // Pod
		PodIPs            []k8sPodIP           `json:"podIPs"`            // Pod
		Addresses         []k8sNodeAddress     `json:"addresses"`         // Node
	}
	k8sPodIP struct {
		IP string `json:"ip"`
	}
	k8sContainerStatus struct {
		State struct {
			Terminated *struct {
				FinishedAt string `json:"finishedAt"`
			} `json:"terminated"`
		} `json:"state"`
	}
	k8sNodeAddress struct {
		Type    string `json:"type"`
		Address string `json:"address"`
	}
)

// inventoryContents is what one read of an inventory file yields.
type inventoryContents struct {
	pods     []*Pod
	nodes    []*Node
	services []*Service
	// hostNetworkPods counts Pods left out because they use the host
	// network; ignored counts objects of other kinds.
	hostNetworkPods, ignored int
}

var errNoObjects = errors.New("no YAML documents")

// parseInventory reads a v1 List (as printed by `kubectl get ... -o yaml` or
// `-o json`), a single object, or several of either as a multi-document YAML
// stream or concatenated JSON objects.
// Objects of kinds other than Pod, Node and Service, and objects whose
// apiVersion is not v1, are ignored. Any malformed document or field fails
// the whole read.
func parseInventory(ctx context.Context, data []byte) (*inventoryContents, error) {
	if looksLikeJSON(data) {
		if c, err := parseJSONInventory(ctx, data); err == nil || !isJSONSyntaxError(err) {
			return c, err
		}
		// Not JSON after all (a YAML flow mapping, say): read it as YAML.
	}
	c := &inventoryContents{}
	docs := 0
	for _, doc := range splitDocuments(data) {
		if isBlankDocument(doc) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		docs++
		var obj k8sObject
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("document %d: %w", docs, err)
		}
		if obj.Kind == "" {
			return nil, fmt.Errorf("document %d: no kind", docs)
		}
		if err := c.add(&obj, ""); err != nil {
			return nil, fmt.Errorf("document %d: %w", docs, err)
		}
	}
	if docs == 0 {
		return nil, errNoObjects
	}
	return c, nil
}

// looksLikeJSON reports whether data starts, after white space and a byte
// order mark, with '{', as the output of `kubectl get ... -o json` does.
func looksLikeJSON(data []byte) bool {
	data = bytes.TrimPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("\xef\xbb\xbf"))
	data = bytes.TrimLeft(data, " \t\r\n")
	return len(data) > 0 && data[0] == '{'
}

// parseJSONInventory reads one or more concatenated JSON objects, each a
// List or a single object. JSON is a subset of YAML, but decoding it
// directly is many times faster than going through a YAML parser.
func parseJSONInventory(ctx context.Context, data []byte) (*inventoryContents, error) {
	c := &inventoryContents{}
	dec := json.NewDecoder(bytes.NewReader(data))
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var obj k8sObject
		if err := dec.Decode(&obj); err == io.EOF {
			return c, nil
		} else if err != nil {
			return nil, fmt.Errorf("JSON value %d: %w", n, err)
		}
		if obj.Kind == "" {
			return nil, fmt.Errorf("JSON value %d: no kind", n)
		}
		if err := c.add(&obj, ""); err != nil {
			return nil, fmt.Errorf("JSON value %d: %w", n, err)
		}
	}
}

func isJSONSyntaxError(err error) bool {
	var syntax *json.SyntaxError
	return errors.As(err, &syntax) || errors.Is(err, io.ErrUnexpectedEOF)
}

func (c *inventoryContents) add(obj *k8sObject, defaultKind string) error {
	kind := obj.Kind
	if kind == "" {
		kind = defaultKind
	}
	if kind == "List" || strings.HasSuffix(kind, "List") {
		// Items of a typed list (PodList, ...) may omit their kind.
		itemKind := strings.TrimSuffix(kind, "List")
		for i, item := range obj.Items {
			if item == nil {
				return fmt.Errorf("items[%d]: empty", i)
			}
			if err := c.add(item, itemKind); err != nil {
				return fmt.Errorf("items[%d]: %w", i, err)
			}
		}
		return nil
	}
	if obj.APIVersion != "" && obj.APIVersion != "v1" {
		c.ignored++
		return nil
	}
	var err error
	switch kind {
	case "Pod":
		err = c.addPod(obj)
	case "Node":
		err = c.addNode(obj)
	case "Service":
		err = c.addService(obj)
	default:
		c.ignored++
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, objectName(&obj.Metadata), err)
	}
	return nil
}

func objectName(m *k8sMeta) string {
	if m.Namespace == "" {
		return fmt.Sprintf("%q", m.Name)
	}
	return fmt.Sprintf("%q", m.Namespace+"/"+m.Name)
}

func (c *inventoryContents) addPod(obj *k8sObject) error {
	if obj.Metadata.Name == "" {
		return errors.New("no metadata.name")
	}
	created, err := parseTimestamp(obj.Metadata.CreationTimestamp)
	if err != nil {
		return err
	}
	if obj.Spec.HostNetwork {
		c.hostNetworkPods++
		return nil
	}
	var ips []netip.Addr
	for i, a := range obj.Status.PodIPs {
		ip, err := parseAddr(a.IP)
		if err != nil {
			return fmt.Errorf("status.podIPs[%d]: %w", i, err)
		}
		if ip.IsValid() {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		ip, err := parseAddr(obj.Status.PodIP)
		if err != nil {
			return fmt.Errorf("status.podIP: %w", err)
		}
		if ip.IsValid() {
			ips = append(ips, ip)
		}
	}
	var wl Workload
	for _, o := range obj.Metadata.OwnerReferences {
		if o.Controller {
			wl = workloadOf(o.Kind, o.Name, obj.Metadata.Labels)
			break
		}
	}
	finished := podFinished(obj.Status.Phase)
	var end time.Time
	for i, cs := range obj.Status.ContainerStatuses {
		if cs.State.Terminated == nil || !finished {
			continue
		}
		t, err := time.Parse(time.RFC3339, cs.State.Terminated.FinishedAt)
		if err != nil && cs.State.Terminated.FinishedAt != "" {
			return fmt.Errorf("status.containerStatuses[%d].state.terminated.finishedAt: %w", i, err)
		}
		if t.After(end) {
			end = t
		}
	}
	c.pods = append(c.pods, normalizePod(Pod{
		Namespace: obj.Metadata.Namespace,
		Name:      obj.Metadata.Name,
		UID:       obj.Metadata.UID,
		NodeName:  obj.Spec.NodeName,
		Labels:    obj.Metadata.Labels,
		IPs:       ips,
		Created:   created,
		Finished:  finished,
		Deleted:   end,
		Workload:  wl,
	}))
	return nil
}

func (c *inventoryContents) addNode(obj *k8sObject) error {
	if obj.Metadata.Name == "" {
		return errors.New("no metadata.name")
	}
	n := Node{Name: obj.Metadata.Name, UID: obj.Metadata.UID}
	for i, a := range obj.Status.Addresses {
		if a.Type != "InternalIP" {
			continue
		}
		ip, err := parseAddr(a.Address)
		if err != nil {
			return fmt.Errorf("status.addresses[%d]: %w", i, err)
		}
		if ip.IsValid() {
			n.InternalIP = ip
			break
		}
	}
	cidrs := obj.Spec.PodCIDRs
	if len(cidrs) == 0 && obj.Spec.PodCIDR != "" {
		cidrs = []string{obj.Spec.PodCIDR}
	}
	for i, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("spec.podCIDRs[%d]: %w", i, err)
		}
		n.PodCIDRs = append(n.PodCIDRs, p)
	}
	c.nodes = append(c.nodes, normalizeNode(n))
	return nil
}

func (c *inventoryContents) addService(obj *k8sObject) error {
	if obj.Metadata.Name == "" {
		return errors.New("no metadata.name")
	}
	s := Service{Namespace: obj.Metadata.Namespace, Name: obj.Metadata.Name, UID: obj.Metadata.UID}
	ips := obj.Spec.ClusterIPs
	if len(ips) == 0 && obj.Spec.ClusterIP != "" {
		ips = []string{obj.Spec.ClusterIP}
	}
	for i, a := range ips {
		if a == "None" {
			continue
		}
		ip, err := parseAddr(a)
		if err != nil {
			return fmt.Errorf("spec.clusterIPs[%d]: %w", i, err)
		}
		if ip.IsValid() {
			s.ClusterIPs = append(s.ClusterIPs, ip)
		}
	}
	for i, p := range obj.Spec.Ports {
		proto := ProtocolNumber(p.Protocol)
		if proto == 0 || p.Port < 1 || p.Port > 65535 {
			return fmt.Errorf("spec.ports[%d]: protocol %q port %d is not a TCP, UDP or SCTP port", i, p.Protocol, p.Port)
		}
		s.Ports = append(s.Ports, ServicePort{Name: p.Name, Protocol: proto, Port: uint16(p.Port)})
	}
	c.services = append(c.services, normalizeService(s))
	return nil
}

// parseAddr parses an address; "" gives the zero Addr.
func parseAddr(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	return netip.ParseAddr(s)
}

func parseTimestamp(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("metadata.creationTimestamp: %w", err)
	}
	return t, nil
}

// splitDocuments splits a YAML stream at document markers ("---" and "...")
// at the start of a line. Content after "--- " on the marker line belongs to
// the next document.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	start := 0
	for off := 0; off < len(data); {
		next := len(data)
		line := data[off:]
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line = line[:i]
			next = off + i + 1
		}
		line = bytes.TrimRight(line, " \t\r")
		switch {
		case string(line) == "---" || string(line) == "...":
			docs = append(docs, data[start:off])
			start = next
		case bytes.HasPrefix(line, []byte("--- ")) || bytes.HasPrefix(line, []byte("---\t")):
			docs = append(docs, data[start:off])
			start = off + 4
		}
		off = next
	}
	return append(docs, data[start:])
}

// isBlankDocument reports whether doc holds only blank lines, comments and
// directives.
func isBlankDocument(doc []byte) bool {
	for line := range bytes.Lines(doc) {
		line = bytes.TrimSpace(line)
		if len(line) != 0 && line[0] != '#' && line[0] != '%' {
			return false
		}
	}
	return true
}
