package enrich

import "sluice/flow"

// FillPods names, on a record that lacks them, the Pods at either end and
// their nodes, from Pods looked up by the record's addresses (nil when
// unknown). Fields the exporter sent are kept.
func FillPods(f *flow.Flow, src, dst *Pod) {
	if f.SourcePodName == "" && src != nil {
		fillSide(f, src, &f.SourcePodNamespace, &f.SourcePodName, &f.SourceNodeName,
			flow.SourcePodNamespace, flow.SourcePodName, flow.SourceNodeName)
	}
	if f.DestinationPodName == "" && dst != nil {
		fillSide(f, dst, &f.DestinationPodNamespace, &f.DestinationPodName, &f.DestinationNodeName,
			flow.DestinationPodNamespace, flow.DestinationPodName, flow.DestinationNodeName)
	}
}

func fillSide(f *flow.Flow, p *Pod, ns, name, node *string, nsField, nameField, nodeField flow.Field) {
	*ns, *name = p.Namespace, p.Name
	f.Present.Set(nsField)
	f.Present.Set(nameField)
	if *node == "" && p.NodeName != "" {
		*node = p.NodeName
		f.Present.Set(nodeField)
	}
}
