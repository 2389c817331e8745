package flowlog

import (
	"fmt"

	"sluice/config"
	"sluice/sink"
)

// Factory is the flowLogger sink: Antrea's comma-separated flow log.
func Factory() sink.Factory {
	return sink.Factory{Key: config.SinkFlowLogger, New: newFromConfig}
}

func newFromConfig(env sink.Env) (sink.Sink, error) {
	cfg := env.Config
	l := cfg.FlowLogger
	filters := make([]Filter, 0, len(l.Filters))
	for i, f := range l.Filters {
		var x Filter
		for _, list := range []struct {
			key   string
			names []string
			dst   *[]uint8
		}{
			{"ingressNetworkPolicyRuleActions", f.IngressNetworkPolicyRuleActions, &x.IngressActions},
			{"egressNetworkPolicyRuleActions", f.EgressNetworkPolicyRuleActions, &x.EgressActions},
		} {
			for _, name := range list.names {
				act, err := ParseAction(name)
				if err != nil {
					return nil, cfg.KeyError(fmt.Sprintf("flowLogger.filters[%d].%s", i, list.key), err)
				}
				*list.dst = append(*list.dst, act)
			}
		}
		filters = append(filters, x)
	}
	s, err := New(Options{Path: l.Path, MaxSizeMB: l.MaxSize, MaxBackups: l.MaxBackups,
		MaxAgeDays: l.MaxAge, Compress: l.Compress, PrettyPrint: l.PrettyPrint, Filters: filters,
		Log: env.Log, Metrics: env.Metrics, Name: config.SinkFlowLogger})
	if err != nil {
		return nil, cfg.KeyError("flowLogger.path", err)
	}
	return s, nil
}
