package supervisor

import "testing"

func TestLdflagsVersionParse(t *testing.T) {
	for _, tc := range []struct {
		flags, want string
		ok          bool
	}{
		{"-X github.com/hotproxy/hotproxy/internal/version.Version=v1.2.3", "v1.2.3", true},
		{"-s -w -X=github.com/hotproxy/hotproxy/internal/version.Version=v-next", "v-next", true},
		{`-X "github.com/hotproxy/hotproxy/internal/version.Version=v9"`, "v9", true},
		{"-X main.version=v1", "", false},
		{"", "", false},
	} {
		got, ok := ldflagsVersion(tc.flags)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ldflagsVersion(%q) = %q, %v; want %q, %v", tc.flags, got, ok, tc.want, tc.ok)
		}
	}
}
