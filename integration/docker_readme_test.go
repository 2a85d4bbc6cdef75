package integration

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestDockerReadme runs the sh block of the README's "In a container"
// section as written, from the module root, with the engine: every command
// must exit 0, and the container `docker stop` stops must have exited 0. The one liberty taken: a `docker exec` is retried for up to
// 15 s, since `docker run -d` returns before the supervisor inside has
// bound its control socket, which a person typing the next line never
// races.
func TestDockerReadme(t *testing.T) {
	e := requireEngine(t)
	if filepath.Base(e.cli) != "docker" {
		t.Skipf("the README's commands are docker's; the engine here is %s", e.cli)
	}
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	commands := readmeBlock(t, filepath.Join(root, "README.md"), "In a container")
	if len(commands) < 5 {
		t.Fatalf("the README's container section has %d commands: %q", len(commands), commands)
	}
	// The block names its container; one already there is someone
	// else's.
	for _, c := range commands {
		if f := strings.Fields(c); len(f) > 4 && f[0] == "docker" && f[1] == "run" {
			for i, w := range f {
				if w == "--name" && i+1 < len(f) {
					if res := e.do(30*time.Second, "inspect", f[i+1]); res.Code == 0 {
						t.Skipf("a container named %s exists on this engine already; the README's block would collide with it", f[i+1])
					}
					name := f[i+1]
					t.Cleanup(func() {
						if t.Failed() {
							res := e.do(30*time.Second, "logs", name)
							t.Logf("container %s:\n%s%s", name, res.Stdout, res.Stderr)
						}
						e.do(time.Minute, "rm", "-f", name)
					})
				}
			}
		}
	}
	for _, c := range commands {
		deadline := time.Now().Add(15 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), harness.DefaultBuildTimeout)
			cmd := exec.CommandContext(ctx, "bash", "-c", c)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			cancel()
			if err == nil {
				t.Logf("$ %s\n%s", c, out)
				// "docker stop hp  # drains every generation, exits 0"
				if f := strings.Fields(c); len(f) == 3 && f[0] == "docker" && f[1] == "stop" {
					if code := strings.TrimSpace(e.do(30*time.Second, "inspect", "-f", "{{.State.ExitCode}}", f[2]).Stdout); code != "0" {
						t.Fatalf("after %q the container's exit code is %s, want 0 as the README says", c, code)
					}
				}
				break
			}
			if !strings.HasPrefix(c, "docker exec ") || time.Now().After(deadline) {
				t.Fatalf("README command %q: %v\n%s", c, err, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// readmeBlock returns the commands (comments and blank lines dropped) of
// the first sh block under the heading named section.
func readmeBlock(t *testing.T, path, section string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cmds []string
	in, block := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#") && !block:
			if in && len(cmds) > 0 {
				return cmds
			}
			in = strings.TrimSpace(strings.TrimLeft(line, "#")) == section
		case in && line == "```sh":
			block = true
		case block && line == "```":
			return cmds
		case block:
			if c, _, _ := strings.Cut(line, "#"); strings.TrimSpace(c) != "" {
				cmds = append(cmds, strings.TrimSpace(c))
			}
		}
	}
	if !in && len(cmds) == 0 {
		t.Fatalf("%s: no section %q with an sh block", path, section)
	}
	return cmds
}
