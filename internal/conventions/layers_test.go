package conventions

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/hotproxy/hotproxy/"

// The layering of DESIGN §2: lower layers never import higher ones. Each
// entry is a folder and the project packages (prefixes) its non-test files
// may import; nil allows none.
var layers = map[string][]string{
	"config":     nil,
	"shm":        nil,
	"stats":      {"shm", "internal/"},
	"upstream":   {"config", "stats", "internal/"},
	"workers":    {"config", "stats", "upstream", "workers/", "internal/"},
	"hotrestart": {"config", "shm", "internal/", "hotrestart/"},
	"tlsconf":    {"config", "stats"},
}

// TestLayers fails when a package imports one above it: config and shm are
// leaves, stats sees only shm, and nothing below server imports server.
func TestLayers(t *testing.T) {
	root := moduleRoot(t)
	checked := 0
	for folder, allowed := range layers {
		err := filepath.WalkDir(filepath.Join(root, folder), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			checked++
			rel, _ := filepath.Rel(root, path)
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if !strings.HasPrefix(p, module) {
					continue
				}
				p = strings.TrimPrefix(p, module)
				if p == folder || strings.HasPrefix(p, folder+"/") {
					continue // itself and its own sub-packages
				}
				ok := false
				for _, a := range allowed {
					if p == a || strings.HasPrefix(p, a+"/") || (strings.HasSuffix(a, "/") && strings.HasPrefix(p, a)) {
						ok = true
					}
				}
				if !ok {
					t.Errorf("%s imports %s: %s may import only %v (DESIGN §2: lower layers never import higher ones)", rel, p, folder, allowed)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 20 {
		t.Fatalf("only %d files checked: the walk is broken", checked)
	}
}
