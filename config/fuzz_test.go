package config

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/BurntSushi/toml"
)

// FuzzParse checks that Parse never panics, and that an accepted config
// is a fixed point: written back as TOML, it parses to an equal Config.
func FuzzParse(f *testing.F) {
	f.Add(Default)
	f.Add([]byte(issueConfig))
	if b, err := os.ReadFile(examplePath); err == nil {
		f.Add(b)
	}
	files, _ := filepath.Glob("testdata/*.toml")
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("[server]\nconcurrency = 1\n[[clusters]]\nname = \"c\"\nendpoints = [\"[::1]:1\"]\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.toml")
		if err != nil {
			if c != nil {
				t.Fatal("Parse returned both a config and an error")
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		var buf bytes.Buffer
		if err := toml.NewEncoder(&buf).Encode(c); err != nil {
			t.Fatalf("encode accepted config: %v", err)
		}
		c2, err := Parse(buf.Bytes(), "fuzz.toml")
		if err != nil {
			t.Fatalf("re-parse of\n%s\nfailed: %v\n(input:\n%s)", buf.Bytes(), err, data)
		}
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("round trip changed the config:\n%+v\n%+v\nvia\n%s", c, c2, buf.Bytes())
		}
	})
}
