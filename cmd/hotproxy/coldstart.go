package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/shm"
)

// warnColdStartBesideLive warns, loudly, when a cold start (epoch 0) of
// base-id baseID finds a live generation already counting into the same
// stats region: usually a second `serve` (or a second supervisor) of the
// same instance, started by mistake. Epoch 0's restart socket is free when
// the running generation has a later epoch, and with reuse_port its
// listening sockets can be bound a second time, so nothing else stops it:
// both would serve the same addresses, and share one set of stats. It
// only warns (a second instance on purpose gets its own --base-id, and the
// check, reading the region, must never stop a proxy from starting).
func warnColdStartBesideLive(log hclog.Logger, cfg *config.Config, baseID int) {
	path := cfg.Stats.Path
	if path == "" {
		path = shm.DefaultPath(uint64(baseID))
	}
	owners, err := shm.LiveOwners(path)
	if err != nil || len(owners) == 0 {
		return // a region this one cannot read is serve's to report
	}
	var gens []string
	newest := owners[0]
	for _, ow := range owners {
		if ow.PID == os.Getpid() {
			continue
		}
		gens = append(gens, fmt.Sprintf("pid %d epoch %d", ow.PID, ow.Epoch))
		if ow.Epoch > newest.Epoch {
			newest = ow
		}
	}
	if len(gens) == 0 {
		return
	}
	log.Warn(fmt.Sprintf("COLD START BESIDE A RUNNING INSTANCE: base-id %d already has a live generation (%s) using %s; "+
		"this one starts cold next to it, sharing its stats and, with reuse_port, its listening addresses. "+
		"To replace it, hot restart it (hotproxy reload, or serve --restart-epoch %d); to run a second instance, give it another --base-id and [stats] path",
		baseID, strings.Join(gens, ", "), path, newest.Epoch+1),
		"base_id", baseID, "region", path)
}
