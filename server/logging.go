package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/internal/safefile"
)

// NewLogger builds the process logger. level is trace, debug, info, warn or
// error; format is text or json.
func NewLogger(w io.Writer, level, format string) (hclog.Logger, error) {
	lvl := hclog.LevelFromString(level)
	if lvl == hclog.NoLevel {
		return nil, fmt.Errorf("log level %q: unknown (use trace, debug, info, warn or error)", level)
	}
	var json bool
	switch format {
	case "", "text":
	case "json":
		json = true
	default:
		return nil, fmt.Errorf("log format %q: unknown (use text or json)", format)
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "hotproxy",
		Level:      lvl,
		Output:     w,
		JSONFormat: json,
	}), nil
}

// LogFile is the process log's file ([log] path): appended to with
// O_APPEND, so that the supervisor and its generations, each with a
// descriptor of its own, write whole lines to one file without clobbering
// each other; and opened again by Reopen after logrotate moved it away
// (SIGUSR1), since the old descriptor would go on writing to the moved file.
type LogFile struct {
	path string

	mu sync.Mutex // guards f: a write never meets a half-done reopen
	f  *os.File
}

// OpenLogFile opens path for appending, creating it mode 0640. The path is
// often in a directory other users may write (/tmp): a symbolic link, a
// second hard link or a file of another user there is refused
// (internal/safefile), never appended to.
func OpenLogFile(path string) (*LogFile, error) {
	f, err := openAppend(path)
	if err != nil {
		return nil, err
	}
	return &LogFile{path: path, f: f}, nil
}

func openAppend(path string) (*os.File, error) {
	f, err := safefile.OpenAppend(path, 0o640)
	if errors.Is(err, safefile.ErrUnsafe) {
		return nil, fmt.Errorf("log.path %q: %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("log.path %q: %w (create its directory, or make it writable by this user)", path, err)
	}
	return f, nil
}

// Path is the file's path.
func (l *LogFile) Path() string { return l.path }

// Write appends p to the file.
func (l *LogFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

// Reopen opens the path again and writes there from now on. When the path
// cannot be opened, the old file is kept: lines land in the moved file
// rather than nowhere.
func (l *LogFile) Reopen() error {
	f, err := openAppend(l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	return old.Close()
}

// Close closes the file.
func (l *LogFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

var _ io.Writer = (*LogFile)(nil)
