package main

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/stats"
)

// statsExpectation is `hotproxy stats --expect NAME=VALUE`: a check with an
// exit status, for a container HEALTHCHECK in exec form (the image has no
// shell, so no `| grep`).
type statsExpectation struct {
	name, value string
}

// parseStatsExpectation reads NAME=VALUE.
func parseStatsExpectation(s string) (statsExpectation, error) {
	name, value, ok := strings.Cut(s, "=")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !ok || name == "" || value == "" {
		return statsExpectation{}, fmt.Errorf("--expect %q: want NAME=VALUE, e.g. --expect server.live=1", s)
	}
	return statsExpectation{name: name, value: value}, nil
}

// check compares the stat's value as `hotproxy stats` prints it (the text
// format's "name: value") with the expected one, and says which it read
// when they differ.
func (e statsExpectation) check(snap *shm.Snapshot) error {
	var b bytes.Buffer
	opts := stats.ExposeOptions{Filter: regexp.MustCompile("^" + regexp.QuoteMeta(e.name) + "$")}
	if err := stats.WriteText(&b, snap, opts); err != nil {
		return err
	}
	got, found := strings.CutPrefix(strings.TrimSpace(b.String()), e.name+":")
	if !found {
		return fmt.Errorf("--expect %s=%s: the region has no stat %s", e.name, e.value, e.name)
	}
	if got = strings.TrimSpace(got); got != e.value {
		return fmt.Errorf("--expect %s=%s: %s is %s", e.name, e.value, e.name, got)
	}
	return nil
}

// expectStat runs --expect against the region of src.
func expectStat(src statsRegion, expect string, withPrintFlags bool, stderr io.Writer) int {
	if withPrintFlags {
		fmt.Fprintln(stderr, "hotproxy stats: --expect prints nothing; it does not combine with --watch, --format or --filter")
		return exitUsage
	}
	e, err := parseStatsExpectation(expect)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
		return exitUsage
	}
	snap, err := src.read()
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
		return 1
	}
	if err := e.check(snap); err != nil {
		fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
		return 1
	}
	return 0
}
