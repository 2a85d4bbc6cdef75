package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogFileReopen: after logrotate's rename, Reopen makes the next
// lines land in a new file at the path, and none in the moved one.
func TestLogFileReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hotproxy.log")
	lf, err := OpenLogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if _, err := lf.Write([]byte("before\n")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("log file: %v, %v; want mode 0640", fi, err)
	}
	rotated := path + ".1"
	if err := os.Rename(path, rotated); err != nil {
		t.Fatal(err)
	}
	if err := lf.Reopen(); err != nil {
		t.Fatal(err)
	}
	if _, err := lf.Write([]byte("after\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(rotated); string(b) != "before\n" {
		t.Errorf("moved file holds %q, want only the line before the reopen", b)
	}
	if b, _ := os.ReadFile(path); string(b) != "after\n" {
		t.Errorf("new file holds %q, want the line after the reopen", b)
	}
	// A path that cannot be opened: the error names the key, and the old
	// file goes on receiving lines.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := lf.Reopen(); err == nil || !strings.Contains(err.Error(), "log.path") {
		t.Errorf("Reopen onto a directory: %v, want an error naming log.path", err)
	}
	if _, err := lf.Write([]byte("still\n")); err != nil {
		t.Errorf("write after a failed reopen: %v", err)
	}
}
