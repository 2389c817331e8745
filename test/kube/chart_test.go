package kube_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"sluice/config"
	"sluice/test/kube/kubetest"
)

// chartVariant is one set of values the chart must render, and apply.
type chartVariant struct {
	name string
	set  []string
	// check looks at the rendered objects beyond what every variant must
	// have.
	check func(t *testing.T, r rendered)
	// noExporter: the variant turns the exporter off (an Aggregate tier
	// beside an ingest tier's release), so its objects are not required.
	noExporter bool
}

// rendered indexes a manifest's objects by "Kind/name".
type rendered map[string]*unstructured.Unstructured

func (r rendered) get(t *testing.T, kind, name string, into any) {
	t.Helper()
	u, ok := r[kind+"/"+name]
	if !ok {
		t.Fatalf("no %s %s rendered; have %v", kind, name, keys(r))
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
}

func keys(r rendered) []string {
	var out []string
	for k := range r {
		out = append(out, k)
	}
	return out
}

func servicePorts(t *testing.T, r rendered) map[string]int32 {
	var svc corev1.Service
	r.get(t, "Service", "flow-aggregator", &svc)
	out := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		out[string(p.Protocol)+"/"+p.Name] = p.Port
	}
	return out
}

// aggregatorConfig parses the ConfigMap's configuration file the way
// `sluice aggregator --config` does, validation included.
func aggregatorConfig(t *testing.T, r rendered) *config.Aggregator {
	t.Helper()
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", "flow-aggregator-configmap", &cm)
	cfg, err := config.Parse([]byte(cm.Data["flow-aggregator.conf"]), "flow-aggregator.conf")
	if err != nil {
		t.Fatalf("the rendered configuration does not load:\n%v\n%s", err, cm.Data["flow-aggregator.conf"])
	}
	return cfg
}

func chartVariants() []chartVariant {
	return []chartVariant{
		{name: "defaults", check: func(t *testing.T, r rendered) {
			cfg := aggregatorConfig(t, r)
			if cfg.Mode != config.ModeAggregate || cfg.AggregatorTransportProtocol != "tls" || cfg.Sluice.GRPCAddress != ":14739" {
				t.Errorf("configuration: mode %s, transport %s, grpc %q", cfg.Mode, cfg.AggregatorTransportProtocol, cfg.Sluice.GRPCAddress)
			}
			if cfg.FlowAggregatorAddress != "flow-aggregator.flow-aggregator.svc" {
				t.Errorf("flowAggregatorAddress %q", cfg.FlowAggregatorAddress)
			}
			want := map[string]int32{"UDP/ipfix-udp": 4739, "TCP/ipfix-tcp": 4739, "TCP/grpc": 14739, "TCP/flowstream-grpc": 14740, "TCP/api": 10348}
			if got := servicePorts(t, r); !equalMaps(got, want) {
				t.Errorf("Service ports %v, want %v", got, want)
			}
			var d appsv1.Deployment
			r.get(t, "Deployment", "flow-aggregator", &d)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("Deployment replicas %v, strategy %q", d.Spec.Replicas, d.Spec.Strategy.Type)
			}
			pod := d.Spec.Template.Spec
			c := pod.Containers[0]
			if pod.ServiceAccountName != "flow-aggregator" || pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil ||
				!*pod.SecurityContext.RunAsNonRoot || *pod.SecurityContext.RunAsUser == 0 {
				t.Errorf("aggregator Pod: service account %q, security context %+v", pod.ServiceAccountName, pod.SecurityContext)
			}
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("aggregator probes: %+v %+v", c.LivenessProbe, c.ReadinessProbe)
			}
			if c.Resources.Requests.Cpu().String() != "500m" || c.Resources.Requests.Memory().String() != "256Mi" {
				t.Errorf("aggregator requests %v", c.Resources.Requests)
			}
			if strings.Join(c.Args, " ") != "aggregator --config=/etc/flow-aggregator/flow-aggregator.conf --log-level=info" {
				t.Errorf("aggregator args %q", c.Args)
			}
			var ds appsv1.DaemonSet
			r.get(t, "DaemonSet", "flow-aggregator-exporter", &ds)
			ep := ds.Spec.Template.Spec
			ec := ep.Containers[0]
			if !ep.HostNetwork || ep.ServiceAccountName != "flow-aggregator-exporter" {
				t.Errorf("exporter Pod: hostNetwork %v, service account %q", ep.HostNetwork, ep.ServiceAccountName)
			}
			caps := ec.SecurityContext.Capabilities
			if len(caps.Add) != 1 || caps.Add[0] != "NET_ADMIN" || len(caps.Drop) != 1 || caps.Drop[0] != "ALL" {
				t.Errorf("exporter capabilities %+v", caps)
			}
			var nodeEnv bool
			for _, e := range ec.Env {
				nodeEnv = nodeEnv || (e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName")
			}
			if !nodeEnv {
				t.Errorf("exporter env %+v: no NODE_NAME from spec.nodeName", ec.Env)
			}
			args := strings.Join(ec.Args, " ")
			// Pod metadata from the cluster (the collector names a Service;
			// Pods are named), without policy attribution.
			if !strings.Contains(args, "--collector=flow-aggregator/flow-aggregator:14739:grpc") || strings.Contains(args, "--pod-cidr") ||
				!strings.Contains(args, "--tls-from-namespace=flow-aggregator") || !slices.Contains(ec.Args, "--in-cluster") ||
				!slices.Contains(ec.Args, "--attribution=false") {
				t.Errorf("exporter args %q", args)
			}
			checkExporterRBAC(t, r, false)
			if _, ok := r["HorizontalPodAutoscaler/flow-aggregator"]; ok {
				t.Error("an HPA by default")
			}
			checkTraceflowRendered(t, r, cfg, true)
			checkUIRendered(t, r, cfg, "", nil, 0)
			checkSinkCredentials(t, r, nil)
			if cfg.S3Uploader.Endpoint != "" {
				t.Errorf("s3Uploader.endpoint %q by default", cfg.S3Uploader.Endpoint)
			}
		}},
		{name: "sink-credentials", set: []string{"clickHouse.enable=true", "clickHouse.connectionSecret.username=flows",
			"clickHouse.connectionSecret.password=pw", "s3Uploader.enable=true", "s3Uploader.bucketName=flows",
			"s3Uploader.endpoint=http://minio.storage.svc:9000", "s3Uploader.awsCredentials.aws_access_key_id=AKID",
			"s3Uploader.awsCredentials.aws_secret_access_key=SECRET", "s3Uploader.awsCredentials.aws_session_token=TOKEN"},
			check: func(t *testing.T, r rendered) {
				cfg := aggregatorConfig(t, r)
				if !cfg.ClickHouse.Enable || !cfg.S3Uploader.Enable || cfg.S3Uploader.Endpoint != "http://minio.storage.svc:9000" {
					t.Errorf("clickHouse.enable %v, s3Uploader.enable %v, s3Uploader.endpoint %q", cfg.ClickHouse.Enable,
						cfg.S3Uploader.Enable, cfg.S3Uploader.Endpoint)
				}
				checkSinkCredentials(t, r, map[string]string{"CH_USERNAME": "flows", "CH_PASSWORD": "pw",
					"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET", "AWS_SESSION_TOKEN": "TOKEN"})
			}},
		{name: "ui", set: []string{"sluice.ui.enable=true"}, check: func(t *testing.T, r rendered) {
			// On the Pod's loopback: kubectl port-forward reaches it, the
			// Service does not list it.
			checkUIRendered(t, r, aggregatorConfig(t, r), "127.0.0.1:10351", nil, 10351)
			want := map[string]int32{"UDP/ipfix-udp": 4739, "TCP/ipfix-tcp": 4739, "TCP/grpc": 14739, "TCP/flowstream-grpc": 14740, "TCP/api": 10348}
			if got := servicePorts(t, r); !equalMaps(got, want) {
				t.Errorf("Service ports %v, want %v", got, want)
			}
		}},
		{name: "ui-ingress", set: []string{"sluice.ui.enable=true", "sluice.ui.port=9090", "sluice.ui.bindAddress=0.0.0.0",
			"sluice.ui.allowedHosts={sluice.example.com,sluice.example.com:8443}"}, check: func(t *testing.T, r rendered) {
			checkUIRendered(t, r, aggregatorConfig(t, r), "0.0.0.0:9090", []string{"sluice.example.com", "sluice.example.com:8443"}, 9090)
			want := map[string]int32{"UDP/ipfix-udp": 4739, "TCP/ipfix-tcp": 4739, "TCP/grpc": 14739, "TCP/flowstream-grpc": 14740, "TCP/api": 10348, "TCP/ui": 9090}
			if got := servicePorts(t, r); !equalMaps(got, want) {
				t.Errorf("Service ports %v, want %v", got, want)
			}
		}},
		{name: "attribution", set: []string{"exporter.attribution.enable=true"}, check: func(t *testing.T, r rendered) {
			var ds appsv1.DaemonSet
			r.get(t, "DaemonSet", "flow-aggregator-exporter", &ds)
			if args := ds.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--in-cluster") ||
				slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--attribution") }) {
				t.Errorf("exporter args %q: want --in-cluster, and attribution on (its default)", args)
			}
			checkExporterRBAC(t, r, true)
		}},
		{name: "no-traceflow", set: []string{"sluice.traceflow.enable=false"}, check: func(t *testing.T, r rendered) {
			checkTraceflowRendered(t, r, aggregatorConfig(t, r), false)
		}},
		{name: "proxy-hpa", set: []string{"mode=Proxy", "autoscaling.enable=true", "autoscaling.maxReplicas=5"}, check: func(t *testing.T, r rendered) {
			if cfg := aggregatorConfig(t, r); cfg.Mode != config.ModeProxy {
				t.Errorf("mode %s", cfg.Mode)
			}
			var hpa autoscalingv2.HorizontalPodAutoscaler
			r.get(t, "HorizontalPodAutoscaler", "flow-aggregator", &hpa)
			if hpa.Spec.MaxReplicas != 5 || hpa.Spec.ScaleTargetRef.Name != "flow-aggregator" || hpa.Spec.ScaleTargetRef.Kind != "Deployment" {
				t.Errorf("HPA spec %+v", hpa.Spec)
			}
			var d appsv1.Deployment
			r.get(t, "Deployment", "flow-aggregator", &d)
			if d.Spec.Replicas != nil {
				t.Errorf("Deployment replicas %d set beside an HPA", *d.Spec.Replicas)
			}
		}},
		{name: "ipfix-only", set: []string{"sluice.grpcEnable=false", "exporter.protocol=tls"}, check: func(t *testing.T, r rendered) {
			if cfg := aggregatorConfig(t, r); cfg.Sluice.GRPCAddress != "" || cfg.AggregatorTransportProtocol != "tls" {
				t.Errorf("grpc %q, transport %s", cfg.Sluice.GRPCAddress, cfg.AggregatorTransportProtocol)
			}
			want := map[string]int32{"UDP/ipfix-udp": 4739, "TCP/ipfix-tcp": 4739, "TCP/flowstream-grpc": 14740, "TCP/api": 10348}
			if got := servicePorts(t, r); !equalMaps(got, want) {
				t.Errorf("Service ports %v, want %v", got, want)
			}
			var ds appsv1.DaemonSet
			r.get(t, "DaemonSet", "flow-aggregator-exporter", &ds)
			if args := strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--collector=flow-aggregator/flow-aggregator:4739:tls") {
				t.Errorf("exporter args %q", args)
			}
		}},
		// The two tiers of docs/scale.md, each a release of the chart: an
		// ingest tier (Proxy, autoscaled, the kafka sink, Pods left as the
		// exporters named them) and an Aggregate tier of 3 replicas reading
		// the topic.
		{name: "kafka-ingest-tier", set: []string{"mode=Proxy", "autoscaling.enable=true", "kafka.enable=true",
			"kafka.brokers={kafka-0.kafka:9092,kafka-1.kafka:9092}", "sluice.proxy.fillPods=false"}, check: func(t *testing.T, r rendered) {
			cfg := aggregatorConfig(t, r)
			if cfg.Mode != config.ModeProxy || !cfg.Kafka.Enable || len(cfg.Kafka.Brokers) != 2 || cfg.Kafka.Topic != "sluice-flows" ||
				cfg.Kafka.Format != config.KafkaFormatProto || cfg.Sluice.Proxy.FillPods || cfg.Sluice.KafkaInput.Enable {
				t.Errorf("ingest tier: mode %s, kafka %+v, fillPods %v, kafkaInput %v", cfg.Mode, cfg.Kafka, cfg.Sluice.Proxy.FillPods, cfg.Sluice.KafkaInput.Enable)
			}
		}},
		{name: "kafka-aggregate-tier", noExporter: true, set: []string{"replicas=3", "exporter.enable=false", "aggregatorTransportProtocol=none",
			"sluice.grpcEnable=false", "sluice.kafkaInput.enable=true", "sluice.kafkaInput.brokers={kafka-0.kafka:9092}",
			"flowCollector.enable=true", "flowCollector.address=collector.example:4739:tcp"}, check: func(t *testing.T, r rendered) {
			cfg := aggregatorConfig(t, r)
			k := cfg.Sluice.KafkaInput
			if cfg.Mode != config.ModeAggregate || !k.Enable || len(k.Brokers) != 1 || k.Group != "sluice-aggregate" ||
				k.SessionTimeout.Duration != 45*time.Second || cfg.Kafka.Enable {
				t.Errorf("Aggregate tier: mode %s, kafkaInput %+v, kafka sink %v", cfg.Mode, k, cfg.Kafka.Enable)
			}
			var d appsv1.Deployment
			r.get(t, "Deployment", "flow-aggregator", &d)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 || d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
				t.Errorf("Deployment replicas %v, strategy %q: want 3, rolling", d.Spec.Replicas, d.Spec.Strategy.Type)
			}
			if _, ok := r["DaemonSet/flow-aggregator-exporter"]; ok {
				t.Error("the exporter rendered in the Aggregate tier")
			}
		}},
		{name: "grpc-only", set: []string{"aggregatorTransportProtocol=none"}, check: func(t *testing.T, r rendered) {
			if cfg := aggregatorConfig(t, r); cfg.AggregatorTransportProtocol != config.TransportNone || cfg.Sluice.GRPCAddress != ":14739" {
				t.Errorf("grpc %q, transport %s", cfg.Sluice.GRPCAddress, cfg.AggregatorTransportProtocol)
			}
			want := map[string]int32{"TCP/grpc": 14739, "TCP/flowstream-grpc": 14740, "TCP/api": 10348}
			if got := servicePorts(t, r); !equalMaps(got, want) {
				t.Errorf("Service ports %v, want %v", got, want)
			}
		}},
	}
}

func equalMaps(a, b map[string]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func parseRendered(t *testing.T, manifest []byte) rendered {
	t.Helper()
	objs, err := kubetest.Objects(manifest)
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{}
	for _, o := range objs {
		k := o.GetKind() + "/" + o.GetName()
		if _, dup := r[k]; dup {
			t.Fatalf("%s rendered twice", k)
		}
		r[k] = o
	}
	return r
}

// TestChartRenders renders the chart for the default values, Proxy mode
// with an HPA, IPFIX-only and gRPC-only exporters, and checks what each
// must hold; the aggregator's configuration file in each loads as
// `sluice aggregator` loads it.
func TestChartRenders(t *testing.T) {
	for _, v := range chartVariants() {
		t.Run(v.name, func(t *testing.T) {
			out, err := render(t, "flow-aggregator", "flow-aggregator", v.set...)
			if err != nil {
				t.Fatal(err)
			}
			r := parseRendered(t, out)
			for _, k := range []string{"ServiceAccount/flow-aggregator", "ServiceAccount/flow-aggregator-exporter",
				"ClusterRole/flow-aggregator", "ClusterRoleBinding/flow-aggregator", "ClusterRole/flow-aggregator-exporter",
				"ClusterRoleBinding/flow-aggregator-exporter", "ConfigMap/flow-aggregator-configmap",
				"Role/flow-aggregator-certs", "RoleBinding/flow-aggregator-certs",
				"Role/flow-aggregator-exporter-certs", "RoleBinding/flow-aggregator-exporter-certs",
				"Service/flow-aggregator", "Deployment/flow-aggregator", "DaemonSet/flow-aggregator-exporter"} {
				if v.noExporter && strings.Contains(k, "-exporter") {
					continue
				}
				if _, ok := r[k]; !ok {
					t.Errorf("%s not rendered", k)
				}
			}
			for _, o := range r {
				if o.GetNamespace() != "" && o.GetNamespace() != "flow-aggregator" {
					t.Errorf("%s/%s in namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
				}
			}
			v.check(t, r)
		})
	}
}

// TestChartRefuses checks that the chart refuses, with a message saying
// why, what the reference refuses: Aggregate mode with more than one
// replica, and an HPA outside Proxy mode.
func TestChartRefuses(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"replicas=2"}, "replicas=2: Aggregate mode correlates both halves of a connection in one process, so it runs at most 1 replica"},
		// The aggregator would refuse its configuration and crash-loop.
		{[]string{"mode=Proxy", "flowLogger.enable=true"}, "flowLogger.enable: the flow log is written by Aggregate mode only"},
		{[]string{"mode=Aggregate", "autoscaling.enable=true"}, `a HorizontalPodAutoscaler is allowed only in mode "Proxy"`},
		{[]string{"mode=Proxy", "autoscaling.enable=true", "autoscaling.minReplicas=4", "autoscaling.maxReplicas=2"}, "autoscaling.minReplicas must be less than or equal to autoscaling.maxReplicas"},
		{[]string{"sluice.grpcEnable=false"}, `exporter.protocol "grpc" needs sluice.grpcEnable`},
		{[]string{"replicas=3", "sluice.kafkaInput.enable=true"}, "sluice.kafkaInput.brokers must list at least one broker"},
		{[]string{"mode=Proxy", "kafka.enable=true"}, "kafka.brokers must list at least one broker"},
		{[]string{"sluice.ui.enable=true", "sluice.ui.port=10348"}, "sluice.ui.port 10348 is used by another of the aggregator's ports"},
		{[]string{"sluice.ui.enable=true", "sluice.ui.port=70000"}, "sluice.ui.port 70000: must be from 1 to 65535"},
	} {
		_, err := render(t, "flow-aggregator", "flow-aggregator", c.set...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %v: error %v, want one containing %q", c.set, err, c.want)
		}
	}
	// Proxy mode may run several replicas; so may Aggregate mode on Kafka.
	if _, err := render(t, "flow-aggregator", "flow-aggregator", "mode=Proxy", "replicas=3"); err != nil {
		t.Errorf("Proxy mode with 3 replicas: %v", err)
	}
	if _, err := render(t, "flow-aggregator", "flow-aggregator", "replicas=3", "sluice.kafkaInput.enable=true",
		"sluice.kafkaInput.brokers={kafka:9092}"); err != nil {
		t.Errorf("Aggregate mode with 3 replicas reading Kafka: %v", err)
	}
}

// checkTraceflowRendered checks the Traceflow controller's parts: with it
// on, the CRD, the aggregator's grants on Traceflows, and the switch in
// the configuration; with it off, none of them.
func checkTraceflowRendered(t *testing.T, r rendered, cfg *config.Aggregator, on bool) {
	t.Helper()
	if cfg.Sluice.Traceflow.Enable != on {
		t.Errorf("sluice.traceflow.enable = %v, want %v", cfg.Sluice.Traceflow.Enable, on)
	}
	if _, ok := r["CustomResourceDefinition/traceflows.sluice.io"]; ok != on {
		t.Errorf("CRD traceflows.sluice.io rendered: %v, want %v", ok, on)
	}
	var role rbacv1.ClusterRole
	r.get(t, "ClusterRole", "flow-aggregator", &role)
	grants := map[string]string{}
	named := map[string]string{} // grants on objects by name
	for _, rule := range role.Rules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				if len(rule.ResourceNames) > 0 {
					for _, n := range rule.ResourceNames {
						named[g+"/"+res+"/"+n] = strings.Join(rule.Verbs, ",")
					}
					continue
				}
				grants[g+"/"+res] = strings.Join(rule.Verbs, ",")
			}
		}
	}
	// The cluster's identity, with or without Traceflow.
	for _, k := range []string{"/configmaps/antrea-cluster-identity", "/namespaces/kube-system"} {
		if named[k] != "get" {
			t.Errorf("ClusterRole flow-aggregator grants %q on %s, want \"get\"", named[k], k)
		}
	}
	// The model's objects are watched (one informer each), not listed per
	// trace.
	state := []string{"/namespaces", "discovery.k8s.io/endpointslices", "networking.k8s.io/networkpolicies",
		"crd.antrea.io/egresses", "crd.antrea.io/networkpolicies", "crd.antrea.io/clusternetworkpolicies",
		"crd.antrea.io/clustergroups", "crd.antrea.io/groups", "crd.antrea.io/ippools"}
	want := map[string]string{}
	if on {
		want = map[string]string{"sluice.io/traceflows": "get,list,watch,delete", "sluice.io/traceflows/status": "update,patch"}
		for _, k := range state {
			want[k] = "list,watch"
		}
	}
	for _, k := range append([]string{"sluice.io/traceflows", "sluice.io/traceflows/status"}, state...) {
		if grants[k] != want[k] {
			t.Errorf("ClusterRole flow-aggregator grants %q on %s, want %q", grants[k], k, want[k])
		}
	}
}

// checkUIRendered checks the web UI's parts: sluice.ui.address and
// allowedHosts in the configuration, and the aggregator container's "ui"
// port (port 0: none, the UI is off).
func checkUIRendered(t *testing.T, r rendered, cfg *config.Aggregator, addr string, allowed []string, port int32) {
	t.Helper()
	if cfg.Sluice.UI.Address != addr || strings.Join(cfg.Sluice.UI.AllowedHosts, ",") != strings.Join(allowed, ",") {
		t.Errorf("sluice.ui: address %q, allowedHosts %q; want %q, %q", cfg.Sluice.UI.Address, cfg.Sluice.UI.AllowedHosts, addr, allowed)
	}
	if got := cfg.Sluice.UIListenAddress(); got != addr {
		t.Errorf("the aggregator would listen on %q, want %q", got, addr)
	}
	var d appsv1.Deployment
	r.get(t, "Deployment", "flow-aggregator", &d)
	var got int32
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		if p.Name == "ui" {
			got = p.ContainerPort
		}
	}
	if got != port {
		t.Errorf("aggregator container port ui = %d, want %d", got, port)
	}
}

// checkExporterRBAC checks the exporter's ClusterRole: get, list and watch
// on Pods, Nodes and Services (Pod metadata, the Node's Pod CIDRs, the
// aggregator's Service) always; on what the policy model is built from
// only with attribution; nothing else.
func checkExporterRBAC(t *testing.T, r rendered, attribution bool) {
	t.Helper()
	var role rbacv1.ClusterRole
	r.get(t, "ClusterRole", "flow-aggregator-exporter", &role)
	got := map[string]string{}
	for _, rule := range role.Rules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				got[g+"/"+res] = strings.Join(rule.Verbs, ",")
			}
		}
	}
	want := map[string]string{"/pods": "get,list,watch", "/nodes": "get,list,watch", "/services": "get,list,watch"}
	if attribution {
		for _, k := range []string{"/namespaces", "discovery.k8s.io/endpointslices", "networking.k8s.io/networkpolicies",
			"crd.antrea.io/egresses", "crd.antrea.io/networkpolicies", "crd.antrea.io/clusternetworkpolicies",
			"crd.antrea.io/clustergroups", "crd.antrea.io/groups"} {
			want[k] = "get,list,watch"
		}
	}
	if len(got) != len(want) {
		t.Errorf("ClusterRole flow-aggregator-exporter grants %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("ClusterRole flow-aggregator-exporter grants %q on %s, want %q", got[k], k, v)
		}
	}
}

// checkSinkCredentials checks that the aggregator takes the sinks'
// credentials from the reference's Secrets, each optional, and, when want
// names values, that the chart made those Secrets so that each variable
// gets want's value (none made when want is nil). It also checks
// FA_CONFIG_MAP_NAME, the owner of the certificate objects.
func checkSinkCredentials(t *testing.T, r rendered, want map[string]string) {
	t.Helper()
	var d appsv1.Deployment
	r.get(t, "Deployment", "flow-aggregator", &d)
	refs := map[string]string{"CH_USERNAME": "clickhouse-secret/username", "CH_PASSWORD": "clickhouse-secret/password",
		"AWS_ACCESS_KEY_ID":     "flow-aggregator-aws-credentials/aws_access_key_id",
		"AWS_SECRET_ACCESS_KEY": "flow-aggregator-aws-credentials/aws_secret_access_key",
		"AWS_SESSION_TOKEN":     "flow-aggregator-aws-credentials/aws_session_token"}
	env := map[string]corev1.EnvVar{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if e := env["FA_CONFIG_MAP_NAME"]; e.Value != "flow-aggregator-configmap" {
		t.Errorf("FA_CONFIG_MAP_NAME %+v, want the aggregator's ConfigMap flow-aggregator-configmap", e)
	}
	for name, ref := range refs {
		e, ok := env[name]
		if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("aggregator env %s: %+v, want it from Secret %s", name, e, ref)
			continue
		}
		k := e.ValueFrom.SecretKeyRef
		if k.Name+"/"+k.Key != ref || k.Optional == nil || !*k.Optional {
			t.Errorf("aggregator env %s from %s/%s (optional %v), want %s, optional", name, k.Name, k.Key, k.Optional, ref)
			continue
		}
		_, made := r["Secret/"+k.Name]
		if want == nil {
			if made {
				t.Errorf("Secret %s rendered though no credentials are set", k.Name)
			}
			continue
		}
		var sec corev1.Secret
		r.get(t, "Secret", k.Name, &sec)
		if sec.Namespace != d.Namespace {
			t.Errorf("Secret %s in namespace %q, the aggregator's is %q", k.Name, sec.Namespace, d.Namespace)
		}
		if got := string(sec.Data[k.Key]); got != want[name] {
			t.Errorf("%s from Secret %s key %s would be %q, want %q", name, k.Name, k.Key, got, want[name])
		}
	}
}
