package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// configMapDir lays out a directory as the kubelet does for a ConfigMap
// volume: the key is a symlink through ..data, itself a symlink to a
// timestamped directory, and an update writes a new directory and renames
// a new ..data over the old one.
type configMapDir struct {
	t   *testing.T
	dir string
	n   int
}

func newConfigMapDir(t *testing.T, content string) *configMapDir {
	d := &configMapDir{t: t, dir: t.TempDir()}
	d.update(content)
	if err := os.Symlink(filepath.Join("..data", "hotproxy.toml"), filepath.Join(d.dir, "hotproxy.toml")); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *configMapDir) path() string { return filepath.Join(d.dir, "hotproxy.toml") }

func (d *configMapDir) update(content string) {
	d.t.Helper()
	d.n++
	version := filepath.Join(d.dir, "..version"+string(rune('a'+d.n)))
	if err := os.Mkdir(version, 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(version, "hotproxy.toml"), []byte(content), 0o644); err != nil {
		d.t.Fatal(err)
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(version), tmp); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		d.t.Fatal(err)
	}
}

// TestConfigWatcherConfigMapSwap: an update of a ConfigMap-style volume
// (the file itself never written, a symlink renamed) asks for one reload;
// an update to the same content asks for none; a file that cannot be read
// for a moment is no change.
func TestConfigWatcherConfigMapSwap(t *testing.T) {
	d := newConfigMapDir(t, "[server]\ndrain_time = \"1s\"\n")
	reloads := make(chan struct{}, 10)
	w := &configWatcher{path: d.path(), interval: 20 * time.Millisecond, log: hclog.NewNullLogger()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx, func() { reloads <- struct{}{} }) }()
	defer func() { cancel(); <-done }()

	// No change: no reload (several intervals).
	select {
	case <-reloads:
		t.Fatal("a reload with no change")
	case <-time.After(200 * time.Millisecond):
	}
	d.update("[server]\ndrain_time = \"2s\"\n")
	select {
	case <-reloads:
	case <-time.After(5 * time.Second):
		t.Fatal("no reload within 5s of a ConfigMap-style update")
	}
	d.update("[server]\ndrain_time = \"2s\"\n") // same content, new directory
	os.Remove(filepath.Join(d.dir, "..data"))   // and gone for a while
	select {
	case <-reloads:
		t.Fatal("a reload for the same content, or for a file that could not be read")
	case <-time.After(200 * time.Millisecond):
	}
	d.update("[server]\ndrain_time = \"3s\"\n")
	select {
	case <-reloads:
	case <-time.After(5 * time.Second):
		t.Fatal("no reload within 5s of the second change")
	}
	select {
	case <-reloads:
		t.Fatal("two reloads for one change")
	case <-time.After(200 * time.Millisecond):
	}
}
