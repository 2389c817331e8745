// Package enrich resolves Kubernetes metadata for flow records: the Pod that
// held an IP address when a flow started, Nodes by name and Services by
// namespace and name.
//
// A [Store] is the read side used on the per-record path. Implementations:
//
//   - [Static]: a fixed set of objects, for tests.
//   - [Inventory]: a file in the format printed by
//     `kubectl get pods,nodes,services -A -o yaml` (or -o json), reloaded
//     when it changes.
//   - [Kube]: the live cluster through client-go informers.
//
// A Pod IP can be reused by a new Pod once the old one is gone, so Pod
// look-ups take the flow start time and return the Pod that held the IP at
// that time. Deleted objects are remembered for a retention time
// ([DefaultRetention]) so that records about flows of recently deleted Pods
// still resolve.
package enrich

import (
	"encoding/json"
	"net/netip"
	"time"
)

// DefaultRetention is how long deleted objects are remembered.
const DefaultRetention = 5 * time.Minute

// Store is the read side of Kubernetes metadata. Implementations are safe for
// concurrent use, never block on writers and do not allocate, so they can be
// called for every flow record.
//
// Returned objects are shared with the Store and with other callers: treat
// them as read-only.
type Store interface {
	// PodByIP returns the Pod that held ip at time at (normally the flow
	// start time). Among the Pods known to have held ip, it picks the most
	// recently created one whose lifetime [Created, Deleted) contains at. If
	// at is zero or no lifetime contains it, the live Pod holding ip is
	// returned; if at is zero and no live Pod holds ip, the most recently
	// deleted one that is still remembered is returned. IPv4-mapped IPv6
	// addresses are looked up as IPv4.
	PodByIP(ip netip.Addr, at time.Time) (*Pod, bool)
	// NodeByName returns the Node with the given name. A deleted Node is
	// returned while it is remembered.
	NodeByName(name string) (*Node, bool)
	// ServiceByName returns the Service with the given namespace and name. A
	// deleted Service is returned while it is remembered.
	ServiceByName(namespace, name string) (*Service, bool)
	// ServiceByClusterIP returns the Service that has ip among its
	// ClusterIPs, a live one over a remembered deleted one.
	ServiceByClusterIP(ip netip.Addr) (*Service, bool)
}

// Pod is the metadata of a Kubernetes Pod.
type Pod struct {
	Namespace string
	Name      string
	UID       string
	NodeName  string
	Labels    map[string]string
	// IPs are the Pod's addresses (status.podIPs). Pods using the host
	// network are not indexed by IP: their address is the Node's.
	IPs []netip.Addr
	// Created is metadata.creationTimestamp.
	Created time.Time
	// Deleted is when the Pod was seen to be gone, or to have finished;
	// zero while it is alive.
	Deleted time.Time
	// Finished says the Pod has run to completion (status.phase
	// Succeeded or Failed). Its object stays in the API, often for long
	// (a Job's Pods), but it holds no address any more: the CNI gives it
	// to new Pods. A Store remembers it as deleted since it finished, so
	// that it names the flows it made while it ran and no later ones.
	// When it finished is its containers' latest finishedAt, in Deleted
	// (zero if they report none: then when it is first seen finished).
	Finished bool
	// Workload is what runs the Pod, from its controller owner reference
	// (for the web UI's grouping; no record field carries it).
	Workload Workload

	// labelsJSON caches LabelsJSON for Pods owned by a Store; "" means not
	// computed.
	labelsJSON string
}

// LabelsJSON returns the Pod's labels as a JSON object with sorted keys, the
// value of the sourcePodLabels / destinationPodLabels IEs: "{}" for a Pod
// without labels and "" for a nil Pod. For Pods returned by a Store the value
// is computed once, when the Store loads the Pod.
func (p *Pod) LabelsJSON() string {
	if p == nil {
		return ""
	}
	if p.labelsJSON != "" {
		return p.labelsJSON
	}
	return marshalLabels(p.Labels)
}

func marshalLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return "{}"
	}
	// encoding/json writes map keys in sorted order, and cannot fail for a
	// map[string]string (invalid UTF-8 is replaced, not rejected).
	b, err := json.Marshal(labels)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// Node is the metadata of a Kubernetes Node.
type Node struct {
	Name string
	UID  string
	// InternalIP is the first address of type InternalIP in
	// status.addresses; invalid (the zero Addr) if there is none.
	InternalIP netip.Addr
	PodCIDRs   []netip.Prefix
}

// Service is the metadata of a Kubernetes Service.
type Service struct {
	Namespace string
	Name      string
	UID       string
	// ClusterIPs is empty for headless ("None") and ExternalName Services.
	ClusterIPs []netip.Addr
	// Ports are the Service's ports, for naming a port reached through a
	// ClusterIP ("namespace/name:port").
	Ports []ServicePort
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string
	Protocol uint8 // IANA protocol number: 6 TCP, 17 UDP, 132 SCTP
	Port     uint16
}

// PortName is the reference's name for the port of s that serves proto
// and port: "namespace/name:portName" (portName may be empty), and false
// when s has no such port.
func (s *Service) PortName(proto uint8, port uint16) (string, bool) {
	for _, p := range s.Ports {
		if p.Protocol == proto && p.Port == port {
			return s.Namespace + "/" + s.Name + ":" + p.Name, true
		}
	}
	return "", false
}

// ProtocolNumber maps a Kubernetes protocol name (TCP, UDP, SCTP; empty
// means TCP) to its IANA number, 0 for an unknown name.
func ProtocolNumber(name string) uint8 {
	switch name {
	case "", "TCP":
		return 6
	case "UDP":
		return 17
	case "SCTP":
		return 132
	}
	return 0
}
