package safefiletest

import (
	"strconv"

	"golang.org/x/sys/unix"
)

func mountTmpfs(dir string, size int) error {
	return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.Itoa(size)+",mode=0700")
}

func unmount(dir string) error { return unix.Unmount(dir, unix.MNT_DETACH) }
