package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Prune removes the region file at path if no process uses it: no
// generation holds an owner lock (the kernel releases it when the
// generation exits or dies, so a crashed one does not count), and nobody
// holds the allocation lock (a generation being created or attaching).
// The check and the unlink happen under the allocation lock, and Open
// checks after taking that lock that its file is still the one at the
// path (errReplaced), so a generation attaching at that moment creates a
// new file rather than using the removed one. A file that is not a region
// (no magic) is kept, never removed: it is not ours.
func Prune(path string) (PruneResult, error) {
	res := PruneResult{Path: path}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return res, fmt.Errorf("shm: prune %s: %w", path, err)
	}
	defer f.Close() // drops the allocation lock too
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return res, fmt.Errorf("shm: prune %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		res.Reason = "not a regular file"
		return res, nil
	}
	if st.Size > 0 {
		var magic [8]byte
		if _, err := f.ReadAt(magic[:], 0); err != nil || binary.LittleEndian.Uint64(magic[:]) != Magic {
			res.Reason = "not a hotproxy stats region (no magic): left alone"
			return res, nil
		}
	}
	switch err := ofdLock(f, allocLockOffset, false); {
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EACCES):
		res.Reason = "in use: a generation is creating or attaching to it"
		return res, nil
	case err != nil:
		return res, fmt.Errorf("shm: prune %s: allocation lock: %w", path, err)
	}
	for s := int64(0); s < maxOwnersLimit; s++ {
		held, err := ofdLocked(f, ownerLockBase+s)
		if err != nil {
			return res, fmt.Errorf("shm: prune %s: owner lock %d: %w", path, s, err)
		}
		if held {
			res.Reason = fmt.Sprintf("in use: a live generation holds owner slot %d", s)
			return res, nil
		}
	}
	if err := os.Remove(path); err != nil {
		return res, fmt.Errorf("shm: prune %s: %w", path, err)
	}
	res.Removed, res.Reason = true, "unused"
	return res, nil
}

// LiveOwners returns the owners of the region at path that are alive:
// their generation holds its owner lock (the kernel's word, not the
// owner table's, which a crashed generation leaves saying "live"). A
// missing file has none. It opens the file read-only and never locks or
// writes it.
func LiveOwners(path string) ([]Owner, error) {
	r, err := OpenReader(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	snap, err := r.Snapshot()
	if err != nil {
		return nil, err
	}
	var live []Owner
	for _, ow := range snap.Owners {
		held, err := ofdLockedRead(r.f, ownerLockBase+int64(ow.Slot))
		if err != nil {
			return nil, fmt.Errorf("shm: region %s: owner lock %d: %w", path, ow.Slot, err)
		}
		if held {
			live = append(live, ow)
		}
	}
	return live, nil
}
