package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// TestGolden parses each testdata/*.toml, which must be rejected, and
// compares the error text with testdata/*.golden. Run with -update to
// rewrite the golden files, then read the diff.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.toml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no testdata/*.toml")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Parse(data, filepath.Base(file))
			if err == nil {
				t.Fatal("accepted; every testdata config must be bad")
			}
			got := err.Error() + "\n"
			golden := strings.TrimSuffix(file, ".toml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("error text differs from %s (run go test -update if the change is right)\ngot:\n%s\nwant:\n%s", golden, got, want)
			}
		})
	}
}
