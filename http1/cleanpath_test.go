package http1

import "testing"

func TestCleanPath(t *testing.T) {
	cases := []struct{ target, want string }{
		// the route bypasses: all of them are /admin
		{"/x/../admin", "/admin"},
		{"//admin", "/admin"},
		{"/admin;x", "/admin"},
		{"/x/%2e%2e/admin", "/admin"},
		{"/x/%2E%2e/admin", "/admin"},
		{"/x/..;y/admin", "/admin"},
		{"/./admin/.", "/admin/"},
		{"///admin//", "/admin/"},
		{"/%61dmin", "/admin"},
		{"/x/.%2e/admin", "/admin"},
		// the basics
		{"/", "/"},
		{"", ""},
		{"/a/./b/", "/a/b/"},
		{"/a/b/..", "/a/"},
		{"/a/b/.", "/a/b/"},
		{"/a/b", "/a/b"},
		{"/../../etc", "/etc"},
		{"/..", "/"},
		{"/.", "/"},
		{"/...", "/..."},
		{"/a/..b", "/a/..b"},
		{"/%41dmin", "/Admin"},
		{"/a%2fb", "/a%2fb"},
		{"/a%2F..%2Fb", "/a%2F..%2Fb"},
		{"/a%3Bb", "/a%3Bb"},
		{"/%7e%5F%2D", "/~_-"},
		{"/%zz/%4", "/%zz/%4"},
		{"/a;p=1/b;q", "/a/b"},
		{"/a?b/../c", "/a"},
		{"/a/..?x", "/"},
		{"/a#b", "/a"},
		// the other forms
		{"http://example.com/x/../y?q", "/y"},
		{"HTTPS://example.com", "/"},
		{"http://example.com?q", "/"},
		{"http://example.com:80//a", "/a"},
		{"example.com:443", ""},
		{"*", "*"},
	}
	for _, tc := range cases {
		if got := string(CleanPath(nil, []byte(tc.target))); got != tc.want {
			t.Errorf("CleanPath(%q) = %q, want %q", tc.target, got, tc.want)
		}
		prefix := "keep:"
		if got := string(CleanPath([]byte(prefix), []byte(tc.target))); got != prefix+tc.want {
			t.Errorf("CleanPath(%q, %q) = %q: it must append, and never climb into dst", prefix, tc.target, got)
		}
	}
}

func TestCleanPathIdempotent(t *testing.T) {
	for _, p := range []string{"/a/../../b/./c//d;x/%2e%2e/e", "/%41/%2f/", "//./../"} {
		once := CleanPath(nil, []byte(p))
		if twice := CleanPath(nil, once); string(twice) != string(once) {
			t.Errorf("CleanPath is not idempotent on %q: %q then %q", p, once, twice)
		}
	}
}
