package http1

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestValidIPv6MatchesNetip checks our allocation-free IPv6 check against
// net/netip (what url.Parse, and so a Go backend, uses) on random strings
// over the characters an address is made of: they must agree exactly.
func TestValidIPv6MatchesNetip(t *testing.T) {
	const alphabet = "0123456789abcdefABCDEF:.:.::"
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 0, 48)
	agreedValid := 0
	check := func(b []byte) {
		addr, err := netip.ParseAddr(string(b))
		want := err == nil && !addr.Is4() && addr.Zone() == ""
		if got := validIPv6(b); got != want {
			t.Fatalf("validIPv6(%q) = %v, netip says %v (%v)", b, got, want, err)
		}
		if want {
			agreedValid++
		}
	}
	for _, s := range []string{"::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::ffff:1.2.3.4",
		"1:2:3:4:5:6:1.2.3.4", "::1.2.3.04", "1::2::3", "12345::", ":1", "1:", "1.2.3.4", ""} {
		check([]byte(s))
	}
	for i := 0; i < 200000; i++ {
		buf = buf[:0]
		for n := rng.IntN(40); n > 0; n-- {
			buf = append(buf, alphabet[rng.IntN(len(alphabet))])
		}
		check(buf)
	}
	// Random strings are rarely addresses; build some that are.
	for i := 0; i < 20000; i++ {
		buf = buf[:0]
		groups := rng.IntN(9)
		for g := 0; g < groups; g++ {
			if g > 0 || rng.IntN(4) == 0 {
				buf = append(buf, ':')
			}
			if rng.IntN(6) == 0 {
				buf = append(buf, ':')
			}
			for n := rng.IntN(5); n >= 0; n-- {
				buf = append(buf, alphabet[rng.IntN(16)])
			}
		}
		if rng.IntN(4) == 0 {
			buf = append(buf, ":1.2.3.4"[rng.IntN(2):]...)
		}
		check(buf)
	}
	if agreedValid < 1000 {
		t.Fatalf("only %d valid addresses generated: the test proves little", agreedValid)
	}
}

func TestValidAuthority(t *testing.T) {
	for _, tc := range []struct {
		in       string
		needPort bool
		want     bool
	}{
		{"example.com", false, true},
		{"example.com:8080", false, true},
		{"example.com", true, false},
		{"a_b-c.d~e:1", true, true},
		{"[::1]:443", true, true},
		{"[::1]", false, true},
		{"1.2.3.4:80", true, true},
		{"", false, false},
		{":80", false, false},
		{"a:", false, false},
		{"a:123456", false, false},
		{"a:-1", false, false},
		{"u@a", false, false},
		{"a%41", false, false},
		{"a b", false, false},
		{"[::1", false, false},
		{"[::1]x", false, false},
		{"[1.2.3.4]", false, false},
		{"[fe80::1%25eth0]", false, false},
	} {
		if got := validAuthority([]byte(tc.in), tc.needPort); got != tc.want {
			t.Errorf("validAuthority(%q, needPort %v) = %v, want %v", tc.in, tc.needPort, got, tc.want)
		}
	}
}

func TestEqualFold(t *testing.T) {
	for _, tc := range []struct {
		b, s string
		want bool
	}{
		{"Content-Length", "content-length", true},
		{"CHUNKED", "chunked", true},
		{"chunked", "chunked ", false},
		{"[", "{", false}, // 0x5B and 0x7B differ by the case bit but are not letters
		{"@", "`", false},
		{"\xc9", "\xe9", false}, // not ASCII letters
		{"", "", true},
	} {
		if got := EqualFold([]byte(tc.b), tc.s); got != tc.want {
			t.Errorf("EqualFold(%q, %q) = %v", tc.b, tc.s, got)
		}
		if got := EqualFoldBytes([]byte(tc.b), []byte(tc.s)); got != tc.want {
			t.Errorf("EqualFoldBytes(%q, %q) = %v", tc.b, tc.s, got)
		}
	}
}
