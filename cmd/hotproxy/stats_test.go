package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/shm"
)

// TestStatsCLIErrors runs the verb in process on files that are not a
// region: exit statuses and messages.
func TestStatsCLIErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.stats")
	garbage := filepath.Join(dir, "garbage.stats")
	junk := bytes.Repeat([]byte("not a region\n"), 1000)
	if err := os.WriteFile(garbage, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"missing", []string{"--path", missing}, 1, []string{missing + ": no such file (", "--path"}},
		{"garbage", []string{"--path", garbage}, 1, []string{garbage, "not a valid hotproxy stats region"}},
		{"directory", []string{"--path", dir}, 1, []string{dir, "not a regular file"}},
		{"bad regex", []string{"--path", garbage, "--filter", "a("}, 2, []string{`--filter "a("`}},
		{"bad format", []string{"--format", "xml"}, 2, []string{`--format "xml"`}},
		{"watch with json", []string{"--watch", "1s", "--format", "json"}, 2, []string{"--watch"}},
		{"negative base-id", []string{"--base-id", "-1"}, 2, []string{"--base-id"}},
		{"argument", []string{"extra"}, 2, []string{`unexpected argument "extra"`}},
		{"help", []string{"--help"}, 0, []string{"never touches the running proxy", "-base-id", "-path", "-c ", "-filter", "-usedonly", "-format", "-owners", "-watch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"stats"}, tc.args...), &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstderr: %s", code, tc.code, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q: %s", w, stderr.String())
				}
			}
		})
	}
	if after, err := os.ReadFile(garbage); err != nil || !bytes.Equal(after, junk) {
		t.Errorf("the garbage file was changed (%v)", err)
	}
}

// TestStatsPrune runs `hotproxy stats --prune --dir DIR`: the region a
// live store holds is kept and says why, an unused one is removed, a file
// that is not a region is left alone.
func TestStatsPrune(t *testing.T) {
	dir := t.TempDir()
	livePath := filepath.Join(dir, "hotproxy.1.stats")
	live, err := shm.Open(shm.Options{Path: livePath})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	unusedPath := filepath.Join(dir, "hotproxy.2.stats")
	unused, err := shm.Open(shm.Options{Path: unusedPath})
	if err != nil {
		t.Fatal(err)
	}
	unused.Close()
	foreign := filepath.Join(dir, "hotproxy.3.stats")
	if err := os.WriteFile(foreign, []byte("mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	if code := run([]string{"stats", "--prune", "--dir", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := "kept " + livePath + " (in use: a live generation holds owner slot 0)\n" +
		"removed " + unusedPath + "\n" +
		"kept " + foreign + " (not a hotproxy stats region (no magic): left alone)\n"
	if stdout.String() != want {
		t.Errorf("--prune printed\n%s\nwant\n%s", stdout.String(), want)
	}
	for p, exists := range map[string]bool{livePath: true, unusedPath: false, foreign: true} {
		if _, err := os.Stat(p); (err == nil) != exists {
			t.Errorf("%s: exists=%v after --prune, want %v", p, err == nil, exists)
		}
	}

	// --path prunes that file only; with other output flags it is refused.
	stdout.Reset()
	if code := run([]string{"stats", "--prune", "--path", livePath}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "kept "+livePath) {
		t.Errorf("--prune --path: exit %d, %q", code, stdout.String())
	}
	stderr.Reset()
	if code := run([]string{"stats", "--prune", "--watch", "1s"}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "--watch") {
		t.Errorf("--prune --watch: exit %d, %q", code, stderr.String())
	}
}

func TestConfigArg(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "-c", "a.toml", "--base-id", "3"}, "a.toml"},
		{[]string{"serve", "--config=b.toml"}, "b.toml"},
		{[]string{"serve", "-config", "c.toml"}, "c.toml"},
		{[]string{"serve", "--c=d.toml"}, "d.toml"},
		{[]string{"serve", "--base-id", "3"}, ""},
		{[]string{"serve", "-c"}, ""},
		{[]string{"serve", "--", "-c", "x"}, ""},
		{[]string{"serve", "-cc", "x"}, ""},
	} {
		if got := configArg(c.args); got != c.want {
			t.Errorf("configArg(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

// TestOwnersAloneIsTheTable: `stats --owners` prints the owner table and
// no stat (it used to dump every stat after it); with --filter, the
// table and those stats.
func TestOwnersAloneIsTheTable(t *testing.T) {
	s, path := liveRegion(t)
	s.Counter("listener.web.downstream_rq_total").Lane(1).Add(3)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"stats", "--path", path, "--owners"}, &stdout, &stderr); code != 0 {
		t.Fatalf("stats --owners: exit %d: %s", code, stderr.String())
	}
	if out := stdout.String(); !strings.HasPrefix(out, "SLOT ") || strings.Contains(out, "downstream_rq_total") || strings.Contains(out, ": ") {
		t.Errorf("stats --owners printed more than the owner table:\n%s", out)
	}
	stdout.Reset()
	if code := run([]string{"stats", "--path", path, "--owners", "--filter", "rq_total"}, &stdout, &stderr); code != 0 {
		t.Fatalf("stats --owners --filter: exit %d: %s", code, stderr.String())
	}
	if out := stdout.String(); !strings.HasPrefix(out, "SLOT ") || !strings.Contains(out, "listener.web.downstream_rq_total: 3\n") {
		t.Errorf("stats --owners --filter rq_total: want the table then the stat:\n%s", out)
	}
}

// TestStatsFormatVMRange: --format prometheus writes classic le buckets,
// --format vmrange the VictoriaMetrics ones, with the same names.
func TestStatsFormatVMRange(t *testing.T) {
	s, path := liveRegion(t)
	s.Histogram("listener.web.downstream_rq_time").Lane(1).Record(2.5)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	for format, want := range map[string]string{
		"prometheus": `hotproxy_listener_downstream_rq_time_seconds_bucket{listener="web",le="0.001"} 0`,
		"vmrange":    `hotproxy_listener_downstream_rq_time_seconds_bucket{listener="web",vmrange="2.448e-03...2.783e-03"} 1`,
	} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"stats", "--path", path, "--format", format, "--filter", "rq_time"}, &stdout, &stderr); code != 0 {
			t.Fatalf("stats --format %s: exit %d: %s", format, code, stderr.String())
		}
		if !strings.Contains(stdout.String(), want+"\n") {
			t.Errorf("stats --format %s has no %q:\n%s", format, want, stdout.String())
		}
	}
}
