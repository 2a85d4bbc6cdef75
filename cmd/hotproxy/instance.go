package main

import (
	"fmt"
	"path/filepath"
	"strings"
)

// configArg returns the value of -c/--config (any of -c X, -c=X, --c X,
// -config X, --config=X, ...) on a hotproxy command line, "" if none.
func configArg(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || (name != "c" && name != "config") {
			continue
		}
		if hasVal {
			return val
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// instanceMatch is a region whose live generation runs a given config.
type instanceMatch struct {
	region string
	pid    int
}

// noInstanceError says that no live generation runs the config, and what
// to do.
func noInstanceError(cfgPath string, searched int, dir string) error {
	return fmt.Errorf("%s sets no [stats] path, and no live hotproxy generation runs it (looked at the %d regions in %s): give --base-id B (the instance's base-id) or --path FILE", cfgPath, searched, dir)
}

// manyInstancesError says that several instances run the config.
func manyInstancesError(cfgPath string, ms []instanceMatch) error {
	var l []string
	for _, m := range ms {
		l = append(l, fmt.Sprintf("%s (pid %d)", filepath.Base(m.region), m.pid))
	}
	return fmt.Errorf("%s sets no [stats] path and %d instances run it: %s: give --base-id B or --path FILE", cfgPath, len(ms), strings.Join(l, ", "))
}
