package conventions

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/hotproxy/hotproxy/"

// The layering of DESIGN §2: lower layers never import higher ones. Each
// entry is one package (its folder) and the project packages its non-test
// files may import, exactly: a sub-package has an entry of its own and
// inherits nothing from its parent (workers/http1, a codec, may not import
// upstream because workers may), and a package without an entry fails, so
// a new package is placed in the layering when it is added. A package may
// always import its own sub-packages. nil allows none.
var layers = map[string][]string{
	"config": nil, // the schema, every default and rule: a leaf
	"shm":    nil, // bytes, not stats
	"stats":  {"shm"},

	"internal/accesslog":             {"config", "internal/ratelog", "internal/safefile"},
	"internal/ratelog":               nil,
	"internal/resmon":                nil, // heap, cgroup memory, fds: read for the overload manager
	"internal/smuggle":               nil,
	"internal/unixsock":              {"internal/safefile"},
	"internal/safefile":              nil,
	"internal/safefile/safefiletest": nil,               // test helpers
	"internal/timerslack":            nil,               // the threads' timer slack (server.timer_slack)
	"internal/nbio":                  nil,               // read(2) and write(2) on Go's non-blocking sockets, raw
	"internal/rawsock":               {"internal/nbio"}, // accepted sockets outside net until they must wait
	"internal/version":               nil,
	// Tests only: no production code may lean on them.
	"internal/conventions": nil,

	"tlsconf":  {"config", "stats"},
	"upstream": {"config", "stats", "h2", "internal/nbio"},
	// The exchange core: one proxied request, whatever the protocols;
	// below the front ends and workers that run it, above the transports.
	"exchange": {"upstream", "h2", "http1"},
	// The compiled routing data every front end reads: below them and
	// the snapshot builder that fills it.
	"route": {"exchange", "http1"},
	// The front ends, each its own package, below the workers that run
	// them: the TCP proxy and TLS passthrough.
	"downstream/tcp": {"route", "stats", "upstream"},
	// and the HTTP front end, HTTP/1.1 and HTTP/2 (config: its ALPN
	// name only, never its structs: configBuilders).
	"downstream/http": {"config", "downstream/tcp", "exchange", "h2", "http1", "internal/accesslog", "internal/nbio", "internal/rawsock", "internal/ratelog", "route", "stats", "upstream"},
	"workers": {"config", "downstream/http", "downstream/tcp", "exchange", "route", "stats", "upstream", "internal/accesslog", "internal/rawsock", "internal/ratelog",
		"http1", "workers/steering"},
	// The wire codecs and the socket-steering program: leaves.
	"http1":            nil,
	"h2":               nil, // our HTTP/2 engine: x/net's Framer and hpack only
	"workers/steering": nil,

	"hotrestart":                           {"internal/ratelog", "internal/safefile", "internal/unixsock"},
	"hotrestart/supervisor":                {"config", "hotrestart", "internal/ratelog", "internal/safefile", "internal/timerslack", "internal/unixsock", "internal/version", "shm"},
	"hotrestart/supervisor/supervisortest": {"config"},

	// The xDS client and the mapping of Envoy resources onto config.
	"xds": {"config", "internal/safefile"},
	// The demo control plane: go-control-plane serving a file.
	"cmd/hotproxy-controlplane": nil,

	// One generation's main goroutine builds everything from the config.
	"server": {"config", "hotrestart", "internal/ratelog", "internal/resmon", "internal/safefile", "internal/version", "shm", "stats", "tlsconf", "upstream", "workers", "xds"},
	// Flag parsing and verb dispatch: it may reach every verb's package.
	"cmd/hotproxy": {"config", "hotrestart", "hotrestart/supervisor", "internal/timerslack", "internal/version", "server", "shm", "stats", "tlsconf", "workers"},

	// End-to-end tests and their tools run the binary; they import no
	// package of the proxy but the few they read or reuse.
	"integration":          nil,
	"integration/harness":  {"shm"},
	"integration/loadgen":  nil,
	"scripts/benchbackend": nil,
	"scripts/grpcbackend":  nil,
	"scripts/grpcload":     nil,
	"scripts/idleconns":    nil,
	"scripts/smugglecheck": {"internal/smuggle"},
	"scripts/tcpbulk":      nil,
	"scripts/tlsload":      {"config", "integration/loadgen"},
}

// configFree are the packages below the snapshot builder, which never
// read a raw config.Config (DESIGN §2: "nothing below the snapshot builder
// reads a raw config.Config"): the codecs, the steering program, the
// plumbing, and the stats layers.
var configFree = []string{"shm", "stats", "route", "downstream/tcp", "http1", "h2", "workers/steering",
	"internal/nbio", "internal/rawsock", "internal/ratelog", "internal/resmon", "internal/safefile", "internal/unixsock", "internal/smuggle", "internal/version", "hotrestart"}

// configBuilders are the only files of their package that may read a raw
// config (its types, Load, Parse): the snapshot builder, the one door into
// the data path. The rest of the package may use config's constants
// (protocol names, ALPN names), never its structs.
var configBuilders = map[string][]string{
	"workers":         {"workers/snapshot.go"},
	"downstream/http": nil, // compiled by workers/snapshot.go
}

// TestNoRawConfigBelowTheBuilder: in workers, a file other than the
// snapshot builder that names config.Config, config.Listener, ... reads a
// raw config on the data path, a second source of truth (STYLE: "one door
// into the data path").
func TestNoRawConfigBelowTheBuilder(t *testing.T) {
	root := moduleRoot(t)
	raw := configTypes(t, root)
	if len(raw) < 10 || !raw["Config"] || !raw["Listener"] {
		t.Fatalf("found only %v in config: the parse is broken", raw)
	}
	for _, p := range rawConfigReads(t, root, configBuilders, raw) {
		t.Error(p)
	}
}

// TestNoRawConfigCatches: the check itself, on a made-up file.
func TestNoRawConfigCatches(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "workers"), 0o755)
	os.WriteFile(filepath.Join(root, "workers", "snapshot.go"), []byte("package workers\n\nimport \"github.com/hotproxy/hotproxy/config\"\n\nvar _ *config.Config\n"), 0o644)
	os.WriteFile(filepath.Join(root, "workers", "h2.go"), []byte("package workers\n\nimport cfg \"github.com/hotproxy/hotproxy/config\"\n\nvar _ = cfg.ProtocolHTTP\n\nfunc f(l *cfg.Listener) {}\n"), 0o644)
	got := rawConfigReads(t, root, configBuilders, map[string]bool{"Config": true, "Listener": true})
	if len(got) != 1 || !strings.Contains(got[0], "workers/h2.go") || !strings.Contains(got[0], "config.Listener") {
		t.Fatalf("got %q, want one problem naming workers/h2.go and config.Listener", got)
	}
}

// configTypes lists what a raw config read names: config's exported
// types, and Load and Parse.
func configTypes(tb testing.TB, root string) map[string]bool {
	tb.Helper()
	out := map[string]bool{"Load": true, "Parse": true}
	files, _ := filepath.Glob(filepath.Join(root, "config", "*.go"))
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			tb.Fatal(err)
		}
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, sp := range g.Specs {
					if ts := sp.(*ast.TypeSpec); ts.Name.IsExported() {
						out[ts.Name.Name] = true
					}
				}
			}
		}
	}
	return out
}

// rawConfigReads returns every use of a raw config type in the packages of
// builders outside their builder files.
func rawConfigReads(tb testing.TB, root string, builders map[string][]string, raw map[string]bool) []string {
	tb.Helper()
	var problems []string
	for pkg, allowed := range builders {
		files, _ := filepath.Glob(filepath.Join(root, pkg, "*.go"))
		for _, path := range files {
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if strings.HasSuffix(path, "_test.go") || slices.Contains(allowed, rel) {
				continue
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				tb.Fatal(err)
			}
			name := ""
			for _, imp := range f.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); p == module+"config" {
					name = "config"
					if imp.Name != nil {
						name = imp.Name.Name
					}
				}
			}
			if name == "" {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == name && raw[sel.Sel.Name] {
					problems = append(problems, fmt.Sprintf("%s:%d: config.%s: only %v may read a raw config in %s; take the compiled field from the snapshot (DESIGN §2: nothing below the snapshot builder reads a raw config.Config)",
						rel, fset.Position(sel.Pos()).Line, sel.Sel.Name, allowed, pkg))
				}
				return true
			})
		}
	}
	return problems
}

// TestLayers fails when a package imports one it may not, or when a
// package has no place in the layering.
func TestLayers(t *testing.T) {
	problems, checked := checkLayers(moduleRoot(t), layers, configFree)
	for _, p := range problems {
		t.Error(p)
	}
	if checked < 20 {
		t.Fatalf("only %d files checked: the walk is broken", checked)
	}
}

// TestLayersOfSubPackages: the check itself, on a made-up module — a
// sub-package does not inherit its parent's allowance, a package without
// an entry fails, and a config-free package may not import config even if
// its entry allows it by mistake.
func TestLayersOfSubPackages(t *testing.T) {
	root := t.TempDir()
	write := func(rel, imports string) {
		t.Helper()
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		src := "package p\n\nimport (\n" + imports + ")\n"
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("workers/w.go", "\t_ \""+module+"upstream\"\n\t_ \""+module+"workers/http1\"\n")
	write("workers/http1/h.go", "\t_ \""+module+"upstream\"\n")
	write("workers/http1/h_test.go", "\t_ \""+module+"server\"\n") // tests may
	write("upstream/u.go", "\t_ \"fmt\"\n")
	write("newpkg/n.go", "\t_ \"fmt\"\n")
	write("workers/steering/s.go", "\t_ \""+module+"config\"\n")
	table := map[string][]string{
		"gone":             nil,
		"workers":          {"upstream", "workers/http1"},
		"workers/http1":    nil,
		"workers/steering": {"config"},
		"upstream":         nil,
	}
	problems, _ := checkLayers(root, table, []string{"workers/steering"})
	want := []string{
		"workers/http1/h.go imports upstream",
		"newpkg has no entry",
		"workers/steering/s.go imports config",
		"has gone, which is no package",
	}
	if len(problems) != len(want) {
		t.Errorf("got %d problems, want %d:\n%s", len(problems), len(want), strings.Join(problems, "\n"))
	}
	for _, w := range want {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("no problem says %q:\n%s", w, strings.Join(problems, "\n"))
		}
	}
}

// checkLayers walks every Go package under root and returns what breaks
// table (see layers) or configFree, and how many files it read.
func checkLayers(root string, table map[string][]string, configFree []string) (problems []string, checked int) {
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		pkg := filepath.ToSlash(filepath.Dir(rel))
		allowed, ok := table[pkg]
		if !ok {
			if !seen[pkg] {
				problems = append(problems, fmt.Sprintf("package %s has no entry in the layering table (internal/conventions): say what it may import", pkg))
			}
			seen[pkg] = true
			return nil
		}
		seen[pkg] = true
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, module) {
				continue
			}
			p = strings.TrimPrefix(p, module)
			if p == "config" && slices.Contains(configFree, pkg) {
				problems = append(problems, fmt.Sprintf("%s imports config: %s is below the snapshot builder and reads no raw config (DESIGN §2)", filepath.ToSlash(rel), pkg))
				continue
			}
			if strings.HasPrefix(p, pkg+"/") || slices.Contains(allowed, p) {
				continue
			}
			problems = append(problems, fmt.Sprintf("%s imports %s: %s may import only %v (DESIGN §2: lower layers never import higher ones)", filepath.ToSlash(rel), p, pkg, allowed))
		}
		return nil
	})
	if err != nil {
		problems = append(problems, err.Error())
	}
	for pkg := range table {
		if !seen[pkg] {
			problems = append(problems, fmt.Sprintf("the layering table has %s, which is no package (remove it, or fix its name)", pkg))
		}
	}
	sort.Strings(problems)
	return problems, checked
}
