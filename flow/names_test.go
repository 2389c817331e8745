package flow

import "testing"

func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{ProtocolName(6), "TCP"}, {ProtocolName(58), "ICMPv6"}, {ProtocolName(132), "SCTP"}, {ProtocolName(200), "200"},
		{ActionName(ActionNone), ""}, {ActionName(ActionDrop), "Drop"}, {ActionName(9), "Invalid"},
		{FlowTypeName(FlowTypeInterNode), "inter-node"}, {FlowTypeName(FlowTypeFromExternal), "from-external"}, {FlowTypeName(0), ""},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
