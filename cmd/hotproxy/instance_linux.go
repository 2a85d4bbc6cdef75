package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hotproxy/hotproxy/shm"
)

// regionOfConfig finds the default region (/dev/shm/hotproxy.<id>.stats)
// of the instance that runs the config file cfgPath: a region with a live
// generation (the kernel's word: its owner lock) whose command line has -c
// naming that same file (compared by device and inode, relative paths
// taken from the process's working directory). It is an error when no
// instance, or more than one, runs it. Regions and processes this user
// cannot read are passed over.
func regionOfConfig(cfgPath string) (string, error) {
	want, err := os.Stat(cfgPath)
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(shm.DefaultPath(0))
	regions, err := shm.DefaultRegions(dir)
	if err != nil {
		return "", err
	}
	var found []instanceMatch
	for _, region := range regions {
		owners, err := shm.LiveOwners(region)
		if err != nil {
			continue
		}
		for _, ow := range owners {
			if runsConfig(ow.PID, want) {
				found = append(found, instanceMatch{region, ow.PID})
				break
			}
		}
	}
	switch len(found) {
	case 0:
		return "", noInstanceError(cfgPath, len(regions), dir)
	case 1:
		return found[0].region, nil
	}
	return "", manyInstancesError(cfgPath, found)
}

// runsConfig reports whether process pid was started with -c naming the
// file want.
func runsConfig(pid int, want os.FileInfo) bool {
	proc := "/proc/" + strconv.Itoa(pid)
	raw, err := os.ReadFile(proc + "/cmdline")
	if err != nil || len(raw) == 0 {
		return false
	}
	args := bytes.Split(bytes.TrimSuffix(raw, []byte{0}), []byte{0})
	strs := make([]string, len(args))
	for i, a := range args {
		strs[i] = string(a)
	}
	cfg := configArg(strs[1:])
	if cfg == "" {
		return false
	}
	if !filepath.IsAbs(cfg) {
		cwd, err := os.Readlink(proc + "/cwd")
		if err != nil {
			return false
		}
		cfg = filepath.Join(cwd, cfg)
	}
	got, err := os.Stat(cfg)
	return err == nil && os.SameFile(got, want)
}
