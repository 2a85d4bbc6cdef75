package shm

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// explainFault tells the two causes of a memory fault on a region mapping
// apart. The region is a sparse file: its pages get blocks when first
// touched, so on a full tmpfs the first touch of a new page raises SIGBUS,
// exactly as a touch beyond the end of a truncated file does. A file that
// still has at least the mapped size on a filesystem with less than a page
// free is the first case: the FormatError then says the filesystem is
// full, and its size, and errors.Is(err, syscall.ENOSPC) holds. Anything
// else is left as a truncation. err is returned (changed in place).
//
// The alternative, fallocate(2) of the whole file when it is created,
// would surface ENOSPC as a plain error there, but would make the region
// cost its whole reserved size (every record, string and lane of every
// owner) in memory at once: the sparse reservation exists so that
// capacity costs only the pages used. So the fault is explained instead.
func explainFault(err error, f *os.File, mapped int) error {
	var fe *FormatError
	if !errors.As(err, &fe) || !fe.fault || fe.full != nil || f == nil {
		return err
	}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Size < int64(mapped) {
		return err // shorter than the mapping: truncated, as said
	}
	var fs unix.Statfs_t
	if unix.Fstatfs(int(f.Fd()), &fs) != nil {
		return err
	}
	bsize := uint64(fs.Bsize)
	free := fs.Bfree * bsize
	if free >= uint64(os.Getpagesize()) {
		return err
	}
	fe.full = &fullFilesystem{size: fs.Blocks * bsize, free: free}
	return err
}

// isFull reports whether err is a fault explained as a full filesystem.
func isFull(err error) bool {
	var fe *FormatError
	return errors.As(err, &fe) && fe.fault && fe.full != nil
}
