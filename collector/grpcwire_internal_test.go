package collector

import (
	"testing"
	"time"
)

func TestGRPCTimeout(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"100m": 100 * time.Millisecond, "5S": 5 * time.Second, "1H": time.Hour, "2M": 2 * time.Minute,
		"7u": 7 * time.Microsecond, "9n": 9, "99999999S": 99999999 * time.Second,
	} {
		if got, ok := grpcTimeout(v); !ok || got != want {
			t.Errorf("grpcTimeout(%q) = %v, %v; want %v", v, got, ok, want)
		}
	}
	for _, v := range []string{"", "5", "S", "5s", "-1S", "123456789S", "99999999H", "1.5S"} {
		if got, ok := grpcTimeout(v); ok {
			t.Errorf("grpcTimeout(%q) = %v, want refused", v, got)
		}
	}
}

func TestEncodeGRPCMessage(t *testing.T) {
	for in, want := range map[string]string{
		"plain text":     "plain text",
		"100% sure":      "100%25 sure",
		"line\nbreak":    "line%0Abreak",
		"caf\u00e9":      "caf%C3%A9",
		"":               "",
		"tab\tand ~end~": "tab%09and ~end~",
	} {
		if got := encodeGRPCMessage(in); got != want {
			t.Errorf("encodeGRPCMessage(%q) = %q, want %q", in, got, want)
		}
	}
}
