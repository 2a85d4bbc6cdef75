package shm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openRegionFile opens (creating it if missing) the region file at path
// the way a file in a world-writable directory (/dev/shm) must be opened
// by root: without following a symbolic link at path (another user's link
// would make root create an 85 MB file wherever it points), non-blocking
// (a planted FIFO is refused, not waited on), then checked through the
// descriptor: a regular file, owned by this process's uid, with one link
// (a hard link to a file of root's would be written into). shm imports
// nothing of the project, so this is its own copy of internal/safefile's
// open; the checks are the same. The mode is checked by the caller, under
// the allocation lock.
func openRegionFile(path string, mode os.FileMode) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, uint32(mode.Perm()))
	if errors.Is(err, unix.ELOOP) {
		var st unix.Stat_t
		owner := ""
		if unix.Lstat(path, &st) == nil {
			owner = fmt.Sprintf(" owned by uid %d", st.Uid)
		}
		target, _ := os.Readlink(path)
		return nil, fmt.Errorf("shm: region %s: is a symbolic link%s (to %q), never followed: in a shared directory such as /dev/shm it may be another user's trap (remove it, or set the stats path to the real file)", path, owner, target)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: open region: %w (check the stats path and its permissions; if another user's hotproxy owns it, use another base-id)", err)
	}
	if err := checkRegionFile(fd, path); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: region %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// checkRegionFile refuses a region file that is not a regular file, is
// owned by another uid (root too refuses it: its owner could truncate or
// rewrite it under a root process at any time), or has more than one link.
func checkRegionFile(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("shm: region %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("shm: region %s: not a regular file (%s)", path, adviceForeign)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fmt.Errorf("shm: region %s: owned by uid %d, this process runs as uid %d (run as that user, or %s)", path, st.Uid, euid, adviceForeign)
	}
	if st.Nlink != 1 {
		return fmt.Errorf("shm: region %s: has %d hard links: another name for it may be a file someone planted or one that must not be written (remove the other links, find / -xdev -samefile %s, or %s)", path, st.Nlink, path, adviceForeign)
	}
	return nil
}
