package server

import (
	"fmt"
	"io"

	"github.com/hashicorp/go-hclog"
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
