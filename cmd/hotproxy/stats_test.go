package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
