package flow

import (
	"strings"
	"testing"
)

// parseUIDByDigits is ParseUID as it was before the table look-up, digit
// by digit: the oracle for FuzzParseUID.
func parseUIDByDigits(s string) (UID, bool) {
	var u UID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	unhex := func(c byte) (byte, bool) {
		switch {
		case '0' <= c && c <= '9':
			return c - '0', true
		case 'a' <= c && c <= 'f':
			return c - 'a' + 10, true
		case 'A' <= c && c <= 'F':
			return c - 'A' + 10, true
		}
		return 0, false
	}
	j := 0
	for i := 0; i < len(s); {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i++
			continue
		}
		hi, ok1 := unhex(s[i])
		lo, ok2 := unhex(s[i+1])
		if !ok1 || !ok2 {
			return UID{}, false
		}
		u[j] = hi<<4 | lo
		j++
		i += 2
	}
	return u, true
}

func FuzzParseUID(f *testing.F) {
	for _, s := range []string{"0f0e0d0c-0b0a-0908-0706-050403020100", "0F0E0D0C-0B0A-0908-0706-05040302010A",
		"0f0e0d0c-0b0a-0908-0706-0504030201-0", "-f0e0d0c-0b0a-0908-0706-050403020100", "0f0e0d0g-0b0a-0908-0706-050403020100",
		"", strings.Repeat("-", 36)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, ok := ParseUID(s)
		wu, wok := parseUIDByDigits(s)
		if u != wu || ok != wok {
			t.Fatalf("ParseUID(%q) = %x, %v; digit by digit %x, %v", s, u, ok, wu, wok)
		}
	})
}

// TestParseUIDEveryOctet puts every octet value at every digit of a valid
// UID: only hex digits are taken, with their value.
func TestParseUIDEveryOctet(t *testing.T) {
	base := []byte("0f0e0d0c-0b0a-0908-0706-050403020100")
	for i := range base {
		for c := range 256 {
			s := []byte(string(base))
			s[i] = byte(c)
			u, ok := ParseUID(string(s))
			wu, wok := parseUIDByDigits(string(s))
			if u != wu || ok != wok {
				t.Fatalf("%q: %x, %v; want %x, %v", s, u, ok, wu, wok)
			}
		}
	}
}
