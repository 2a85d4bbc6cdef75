package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
)

// PruneResult is what Prune did with one region file.
type PruneResult struct {
	Path    string
	Removed bool
	// Reason says why the file was kept (or "unused" when removed).
	Reason string
}

// defaultRegionName matches the files of DefaultPath.
var defaultRegionName = regexp.MustCompile(`^hotproxy\.[0-9]+\.stats$`)

// DefaultRegions lists the region files of every base-id in dir (the
// directory of DefaultPath, /dev/shm, when dir is ""), sorted.
func DefaultRegions(dir string) ([]string, error) {
	if dir == "" {
		dir = filepath.Dir(DefaultPath(0))
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("shm: listing regions: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && defaultRegionName.MatchString(e.Name()) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}
