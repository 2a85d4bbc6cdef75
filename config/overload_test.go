package config

import (
	"strings"
	"testing"
)

func TestOverloadTriggers(t *testing.T) {
	cases := []struct {
		table, want string // want "": accepted
	}{
		{"[overload.stop_accepting]\npressure_percent = [95]\n", ""},
		{"[overload.shrink_timeouts]\npressure_percent = [80, 95]\nmonitors = [\"connections\"]\n", ""},
		{"[overload.stop_accepting]\n", "overload.stop_accepting.pressure_percent: []: write [P]"},
		{"[overload.stop_accepting]\npressure_percent = [0]\n", "overload.stop_accepting.pressure_percent: [0]"},
		{"[overload.stop_accepting]\npressure_percent = [95, 80]\n", "[95 80]: write [P]"},
		{"[overload.stop_accepting]\npressure_percent = [80, 101]\n", "[80 101]"},
		{"[overload.stop_accepting]\npressure_percent = [1, 2, 3]\n", "[1 2 3]"},
		{"[overload.refuse_requests]\npressure_percent = [99]\nmonitors = [\"hep\"]\n", `overload.refuse_requests.monitors[0]: "hep": unknown monitor (did you mean "heap"?)`},
		{"[overload.refuse_requests]\npressure_percent = [99]\nmonitors = []\n", "overload.refuse_requests.monitors: empty"},
	}
	for _, tc := range cases {
		c, err := Parse([]byte(tc.table), "o.toml")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.table, err)
		case tc.want == "" && !c.Overload.Enabled():
			t.Errorf("%s: accepted but the overload manager is off", tc.table)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error containing %q", tc.table, err, tc.want)
		}
	}
	c, err := Parse([]byte("[overload]\nheap_limit_mib = 64\n"), "o.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Overload.Enabled() {
		t.Error("[overload] without an action table enables the overload manager")
	}
	c, err = Parse([]byte("[overload.shrink_timeouts]\npressure_percent = [80, 95]\n"), "o.toml")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Overload.ShrinkTimeouts.Monitors; len(got) != len(OverloadMonitors) {
		t.Errorf("default monitors = %v, want %v", got, OverloadMonitors)
	}
	if from, to := c.Overload.ShrinkTimeouts.Range(); from != 0.8 || to != 0.95 {
		t.Errorf("Range() = %v, %v; want 0.8, 0.95", from, to)
	}
}
