package server

import (
	"errors"
	"fmt"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/tlsconf"
	"github.com/hotproxy/hotproxy/workers"
)

// Prepared is everything a generation builds from its config before it
// touches a socket or the previous generation: the compiled snapshot (the
// workers' only door into the data path, its clusters resolved) and the
// TLS configs (certificates, keys and session-ticket keys loaded).
type Prepared struct {
	Snapshot *workers.Snapshot
	TLS      *tlsconf.Set
}

// Close releases what Prepare built and New did not take.
func (p *Prepared) Close() {
	if p != nil && p.TLS != nil {
		p.TLS.Close()
	}
}

// Prepare is the fail-fast build that serve runs first and validate runs
// alone (DESIGN §1: "the same fail-fast build as serve, stopped before
// binding anything"), so that a config that validates starts, and one that
// would fail at start fails validate with the same message. Errors name
// cfg.Source first.
func Prepare(cfg *config.Config, id workers.Identity) (*Prepared, error) {
	return prepareFrom(cfg, id, workers.Concurrency(cfg), nil)
}

// prepareFrom is Prepare for n workers, carrying over from prev (the
// snapshot serving now, nil at start) every cluster whose spec did not
// change (workers.BuildSnapshotFrom): the one build that the file and
// the dynamic configuration both go through.
func prepareFrom(cfg *config.Config, id workers.Identity, n int, prev *workers.Snapshot) (*Prepared, error) {
	if cfg == nil {
		return nil, errors.New("server: no config")
	}
	snap, err := workers.BuildSnapshotFrom(cfg, id, n, prev)
	if err != nil {
		return nil, withSource(cfg, err)
	}
	set, err := tlsconf.Build(cfg)
	if err != nil {
		return nil, withSource(cfg, err)
	}
	return &Prepared{Snapshot: snap, TLS: set}, nil
}

// withSource puts the config's source in front of err, unless err is a
// config error, whose every line names it already.
func withSource(cfg *config.Config, err error) error {
	var ce *config.Error
	if errors.As(err, &ce) {
		return err
	}
	return fmt.Errorf("%s: %w", cfg.Source, err)
}
