package shm

import (
	"os"

	"golang.org/x/sys/unix"
)

// OFD (open file description) fcntl locks: they belong to the open file,
// not the process, are released when it is closed or its holder dies, and
// conflict between two opens of the same file within one process too.

func ofdLock(f *os.File, off int64, wait bool) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: off, Len: 1}
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	for {
		err := unix.FcntlFlock(f.Fd(), cmd, &lk)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

func ofdUnlock(f *os.File, off int64) error {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: off, Len: 1}
	return unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// ofdLocked reports whether another open file description holds a lock on
// the byte at off.
func ofdLocked(f *os.File, off int64) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: off, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}

// ofdLockedRead is ofdLocked for a file opened read-only: it asks about a
// read lock, which any write lock (an owner's) conflicts with, and which a
// read-only open file may ask about.
func ofdLockedRead(f *os.File, off int64) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0, Start: off, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}
