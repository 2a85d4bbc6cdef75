package config

import (
	"strings"
	"testing"
)

// TestStatsFileModeWritable: a stats region that group or others may write
// can be truncated or corrupted by them, so such a file_mode is refused
// with the expected form; read bits for group and others are fine.
func TestStatsFileModeWritable(t *testing.T) {
	for _, mode := range []string{"0666", "0660", "0662", "0620", "0602", "0777"} {
		t.Run(mode, func(t *testing.T) {
			_, err := Parse([]byte("[stats]\nfile_mode = \""+mode+"\"\n"+webOK+clusterC), "bad.toml")
			if err == nil {
				t.Fatalf("file_mode %s accepted", mode)
			}
			if msg := err.Error(); !containsAll(msg, []string{"stats.file_mode", `"` + mode + `"`, "writable by group or others", `"0640"`}) {
				t.Fatalf("error does not name the key, the value and the expected form: %v", err)
			}
		})
	}
	for _, mode := range []string{"0600", "0640", "0644", "0400", "0444"} {
		c, err := Parse([]byte("[stats]\nfile_mode = \""+mode+"\"\n"+webOK+clusterC), "good.toml")
		if err != nil {
			t.Fatalf("file_mode %s refused: %v", mode, err)
		}
		if got := c.Stats.Mode().String(); !strings.HasPrefix(got, "-r") {
			t.Fatalf("file_mode %s parsed as %s", mode, got)
		}
	}
}
