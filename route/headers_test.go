package route

import "testing"

// fakeFields is a request's fields as RequestFields reads them.
type fakeFields [][2]string

func (f fakeFields) RequestField(name string, n int) (string, bool) {
	for _, kv := range f {
		if kv[0] == name {
			if n == 0 {
				return kv[1], true
			}
			n--
		}
	}
	return "", false
}

// TestHeaderMatcher: exact and prefix against a field's values joined
// with ",", case, present, and invert with Envoy's rule for an absent
// field.
func TestHeaderMatcher(t *testing.T) {
	m := func(kind HeaderTest, value string, ignoreCase, invert bool) HeaderMatcher {
		return HeaderMatcher{Name: "x", Kind: kind, Value: value, IgnoreCase: ignoreCase, Invert: invert}
	}
	x := func(vs ...string) fakeFields {
		var f fakeFields
		for _, v := range vs {
			f = append(f, [2]string{"x", v})
		}
		return append(f, [2]string{"y", "other"})
	}
	tests := []struct {
		name   string
		m      HeaderMatcher
		fields fakeFields
		want   bool
	}{
		{"exact", m(HeaderExact, "on", false, false), x("on"), true},
		{"exact other", m(HeaderExact, "on", false, false), x("off"), false},
		{"exact longer", m(HeaderExact, "on", false, false), x("onn"), false},
		{"exact shorter", m(HeaderExact, "on", false, false), x("o"), false},
		{"exact case", m(HeaderExact, "on", false, false), x("ON"), false},
		{"exact ignore_case", m(HeaderExact, "on", true, false), x("ON"), true},
		{"exact empty", m(HeaderExact, "", false, false), x(""), true},
		{"exact empty, value", m(HeaderExact, "", false, false), x("a"), false},
		{"exact absent", m(HeaderExact, "on", false, false), fakeFields{{"y", "on"}}, false},
		{"exact joined", m(HeaderExact, "a,b,c", false, false), x("a", "b", "c"), true},
		{"exact joined, one short", m(HeaderExact, "a,b,c", false, false), x("a", "b"), false},
		{"exact joined, one more", m(HeaderExact, "a,b", false, false), x("a", "b", "c"), false},
		{"exact joined, empty values", m(HeaderExact, ",", false, false), x("", ""), true},
		{"exact joined, no comma", m(HeaderExact, "ab", false, false), x("a", "b"), false},
		{"prefix", m(HeaderPrefix, "pro", false, false), x("prod"), true},
		{"prefix whole", m(HeaderPrefix, "prod", false, false), x("prod"), true},
		{"prefix other", m(HeaderPrefix, "pro", false, false), x("stage"), false},
		{"prefix shorter value", m(HeaderPrefix, "prod", false, false), x("pr"), false},
		{"prefix over values", m(HeaderPrefix, "a,b", false, false), x("a", "bc"), true},
		{"prefix ends at a value", m(HeaderPrefix, "a", false, false), x("a", "b"), true},
		{"prefix ends at the comma", m(HeaderPrefix, "a,", false, false), x("a", "b"), true},
		{"prefix ignore_case", m(HeaderPrefix, "PRO", true, false), x("prod"), true},
		{"present", m(HeaderPresent, "", false, false), x(""), true},
		{"present absent", m(HeaderPresent, "", false, false), fakeFields{}, false},
		{"present invert absent", m(HeaderPresent, "", false, true), fakeFields{}, true},
		{"present invert there", m(HeaderPresent, "", false, true), x("a"), false},
		{"exact invert other", m(HeaderExact, "on", false, true), x("off"), true},
		{"exact invert same", m(HeaderExact, "on", false, true), x("on"), false},
		{"exact invert absent (Envoy: no match)", m(HeaderExact, "on", false, true), fakeFields{}, false},
		{"prefix invert absent (Envoy: no match)", m(HeaderPrefix, "on", false, true), fakeFields{}, false},
	}
	for _, tt := range tests {
		if got := tt.m.matches(tt.fields); got != tt.want {
			t.Errorf("%s: %+v on %q = %v, want %v", tt.name, tt.m, tt.fields, got, tt.want)
		}
	}
}
