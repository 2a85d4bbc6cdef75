package route

import "testing"

func mustPattern(tb testing.TB, s string) HostPattern {
	tb.Helper()
	p, err := CompileHostPattern("host", s)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestTableMatch(t *testing.T) {
	exact, wild := mustPattern(t, "API.example.com:8080"), mustPattern(t, "*.example.com")
	tls := mustPattern(t, "secure.example.com")
	tbl := Table{
		{Index: 0, HostKind: exact.Kind, Host: exact.Name, Path: "/v1", Cluster: "exact"},
		{Index: 1, HostKind: wild.Kind, Host: wild.Name, Path: "/", Prefix: true, Cluster: "wild", ServerName: tls},
		{Index: 2, Path: "/", Prefix: true, Cluster: "any", Connect: true},
	}
	for _, tc := range []struct {
		host, path, sni string
		want            int // -1: none
	}{
		{"api.example.com", "/v1", "", 0},
		{"api.example.com.", "/v1", "", 0},
		{"api.example.com:443", "/v1/x", "", 2}, // exact path, not a prefix
		{"a.example.com", "/x", "secure.example.com", 1},
		{"a.example.com", "/x", "", 2}, // server_name never matches no SNI
		{"example.com", "/x", "secure.example.com", 2},
		{"[::1]:80", "/", "", 2},
	} {
		r := tbl.Match(tc.host, tc.path, tc.sni, nil)
		got := -1
		if r != nil {
			got = r.Index
		}
		if got != tc.want {
			t.Errorf("Match(%q, %q, %q) = route %d, want %d", tc.host, tc.path, tc.sni, got, tc.want)
		}
	}
	if r := tbl.MatchConnect("db.internal:5432", "", nil); r == nil || r.Index != 2 {
		t.Errorf("MatchConnect = %v, want route 2 (the only one with connect)", r)
	}
	if r := (Table{}).Match("a", "/", "", nil); r != nil {
		t.Errorf("an empty table matched %v", r)
	}
}

func TestSNITableMatch(t *testing.T) {
	tbl := SNITable{{ServerNames: []HostPattern{mustPattern(t, "db.example.com")}}, {ServerNames: []HostPattern{mustPattern(t, "*.example.com")}}}
	for sni, want := range map[string]int{"db.example.com": 0, "DB.Example.com": 0, "x.example.com": 1, "example.com": -1, "": -1} {
		if got := tbl.Match(sni); got != want {
			t.Errorf("Match(%q) = %d, want %d", sni, got, want)
		}
	}
}

func TestCompileHostPatternRefuses(t *testing.T) {
	for _, bad := range []string{"*.a*.com", "a.*.com", "*.*.com", "api*.example.com"} {
		if _, err := CompileHostPattern("host", bad); err == nil {
			t.Errorf("CompileHostPattern(%q) accepted it", bad)
		}
	}
}
