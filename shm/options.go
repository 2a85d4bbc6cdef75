package shm

import (
	"os"
	"path/filepath"
	"strconv"

	"github.com/hashicorp/go-hclog"
)

// Options configures Open. The zero value is usable: it opens the default
// region of base-id 0 with one lane.
type Options struct {
	// Path of the region file. Default: DefaultPath(BaseID).
	Path string
	// BaseID selects the default path; ignored when Path is set.
	BaseID uint64
	// Mode of a created file. Default DefaultMode (0640).
	Mode os.FileMode
	// Epoch of this generation (restart epoch), recorded in the owner table.
	Epoch uint64
	// Lanes is the number of lanes this owner writes (1 + workers for the
	// stats package). Default 1. At most MaxLanes of the region.
	Lanes int
	// Capacities used when the region is created; an existing region keeps
	// its own. Defaults: DefaultMaxOwners, DefaultMaxLanes,
	// DefaultMaxRecords, DefaultStringBytes, DefaultValueBytes.
	MaxOwners   int
	MaxLanes    int
	MaxRecords  int
	StringBytes int64
	ValueBytes  int64
	// Logger; default a null logger.
	Logger hclog.Logger
}

// DefaultPath is the default region file of a base-id:
// /dev/shm/hotproxy.<base-id>.stats.
func DefaultPath(baseID uint64) string {
	return filepath.Join("/dev/shm", "hotproxy."+strconv.FormatUint(baseID, 10)+".stats")
}

func (o *Options) withDefaults() Options {
	v := *o
	if v.Path == "" {
		v.Path = DefaultPath(v.BaseID)
	}
	if v.Mode == 0 {
		v.Mode = DefaultMode
	}
	if v.Lanes == 0 {
		v.Lanes = 1
	}
	if v.MaxOwners == 0 {
		v.MaxOwners = DefaultMaxOwners
	}
	if v.MaxLanes == 0 {
		v.MaxLanes = DefaultMaxLanes
	}
	if v.MaxRecords == 0 {
		v.MaxRecords = DefaultMaxRecords
	}
	if v.StringBytes == 0 {
		v.StringBytes = DefaultStringBytes
	}
	if v.ValueBytes == 0 {
		v.ValueBytes = DefaultValueBytes
	}
	if v.Logger == nil {
		v.Logger = hclog.NewNullLogger()
	}
	return v
}
