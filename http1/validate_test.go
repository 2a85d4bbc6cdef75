package http1

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckRequestPartsAgreesWithParse: every method, target and host
// CheckRequestParts is given gets the answer Parse gives the HTTP/1.1
// request line and Host made of them (the same status and reason), so an
// HTTP/2 request is held to the HTTP/1.1 rules byte for byte.
func TestCheckRequestPartsAgreesWithParse(t *testing.T) {
	cases := []struct{ method, target, host string }{
		{"GET", "/", "a"},
		{"GET", "/a/b?c=d%", "Example.com:8080"},
		{"get", "/lowercase-method-is-a-token", "a"},
		{"OPTIONS", "*", "a"},
		{"GET", "*", "a"},
		{"GET /private/x HTTP/1.1", "/bad/x", "a"},
		{"GE T", "/", "a"},
		{"G(T", "/", "a"},
		{"GET", "/a b", "a"},
		{"GET", "/a\\..\\admin", "a"},
		{"GET", "/a#frag", "a"},
		{"GET", "/\x00", "a"},
		{"GET", "/\xe9", "a"},
		{"GET", "/a\tb", "a"},
		{"GET", "/%zz", "a"},
		{"GET", "/x?%zz", "a"},
		{"GET", "relative", "a"},
		{"GET", "/", "secret.test."},
		{"GET", "/", "secret.test.."},
		{"GET", "/", "secret.test;x"},
		{"GET", "/", "a,b"},
		{"GET", "/", "a b"},
		{"GET", "/", "u@a"},
		{"GET", "/", "[::1]:8080"},
		{"GET", "/", "[::g]"},
		{"GET", "/", "a:99x"},
		{"GET", "/" + strings.Repeat("a", DefaultMaxRequestLine-15), "a"},
		{"GET", "/" + strings.Repeat("a", DefaultMaxRequestLine-14), "a"},
	}
	for _, tc := range cases {
		line := tc.method + " " + tc.target + " HTTP/1.1"
		var r Request
		perr := r.Parse([]byte(head(line, "Host: "+tc.host)), Limits{})
		cerr := CheckRequestParts([]byte(tc.method), []byte(tc.target), []byte(tc.host), Limits{})
		if strings.Contains(tc.method, " ") || tc.target == "/a b" {
			// The request line cannot carry these (a space ends a
			// word): the parser refuses
			// the line; the parts are refused all the same.
			if perr == nil || cerr == nil {
				t.Errorf("%q %q %q: Parse %v, CheckRequestParts %v: both must refuse", tc.method, tc.target, tc.host, perr, cerr)
			}
			continue
		}
		if (perr == nil) != (cerr == nil) {
			t.Errorf("%q %q %q: Parse %v, CheckRequestParts %v: they must agree", tc.method, tc.target, tc.host, perr, cerr)
			continue
		}
		if perr != nil && statusOf(t, perr) != statusOf(t, cerr) {
			t.Errorf("%q %q %q: Parse %q, CheckRequestParts %q: same fault, same status", tc.method, tc.target, tc.host, perr, cerr)
		}
	}
}

func TestCheckRequestPartsRefuses(t *testing.T) {
	for _, tc := range []struct{ name, method, target, host, reason string }{
		{"space in method", "GET /private/x HTTP/1.1", "/bad/x", "a", "method"},
		{"empty method", "", "/", "a", "method"},
		{"space in path", "GET", "/bad/x HTTP/1.1", "a", "request target"},
		{"backslash", "GET", "/a\\b", "a", "request target"},
		{"empty path", "GET", "", "a", "request line"},
		{"relative path", "GET", "a/b", "a", "form"},
		{"absolute-form path", "GET", "http://a/", "a", "form"},
		{"asterisk for GET", "GET", "*", "a", "form"},
		{"no authority", "GET", "/", "", ":authority"},
		{"authority a list", "GET", "/", "a,b", "Host"},
	} {
		err := CheckRequestParts([]byte(tc.method), []byte(tc.target), []byte(tc.host), Limits{})
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || !strings.Contains(e.Reason, tc.reason) {
			t.Errorf("%s: %v, want a 400 naming %q", tc.name, err, tc.reason)
		}
	}
	if !ValidHost([]byte("secret.test.")) || ValidHost([]byte("secret.test..")) {
		t.Errorf("ValidHost: one trailing dot is a name, two are not")
	}
}
