package safefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// OpenAppend opens path for appending (O_APPEND), creating it with mode
// perm if missing, without following a symbolic link at path (O_NOFOLLOW),
// and refuses what it opened unless it is a regular file owned by this
// process's effective uid with a single link, or a FIFO this uid owns (a
// log shipper reading a named pipe). A refused file is closed untouched:
// nothing was written to it.
func OpenAppend(path string, perm os.FileMode) (*os.File, error) {
	return open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT, perm, true)
}

// Open is OpenAppend with other flags (O_RDWR, O_CREAT, ...), for a
// regular file only: O_NOFOLLOW and O_CLOEXEC are always added, and the
// same checks are made on the descriptor before it is returned.
func Open(path string, flags int, perm os.FileMode) (*os.File, error) {
	return open(path, flags, perm, false)
}

// open opens non-blocking, so that a FIFO another user planted at path is
// refused at once instead of blocking the open until someone reads it;
// the returned file is blocking again. A FIFO of our own without a reader
// yet (ENXIO) is opened again blocking, as a plain open would.
func open(path string, flags int, perm os.FileMode, allowFIFO bool) (*os.File, error) {
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NOCTTY
	fd, err := unix.Open(path, flags|unix.O_NONBLOCK, uint32(perm.Perm()))
	if errors.Is(err, unix.ENXIO) && allowFIFO {
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO && st.Uid == uint32(os.Geteuid()) {
			fd, err = unix.Open(path, flags, 0)
		}
	}
	if errors.Is(err, unix.ELOOP) {
		return nil, symlinkError(path)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	if err := checkOwned(fd, path, allowFIFO); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// checkOwned checks, through its descriptor, that the file opened at path
// is a regular file owned by this process's effective uid with one link
// (what a file created by this process, or left by an earlier run of it,
// is), or with allowFIFO a FIFO of that uid. Root is held to it too:
// another user's file in a shared directory is a trap for root above all.
func checkOwned(fd int, path string, allowFIFO bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	euid := uint32(os.Geteuid())
	kind := st.Mode & unix.S_IFMT
	switch {
	case kind != unix.S_IFREG && !(allowFIFO && kind == unix.S_IFIFO):
		return &UnsafeError{Path: path, Reason: fmt.Sprintf("not a regular file (%s)", fileType(st.Mode)),
			Advice: "remove it, or choose another path", ForeignOwner: -1}
	case st.Uid != euid:
		return &UnsafeError{Path: path, Reason: fmt.Sprintf("owned by uid %d, not by this process's uid %d: its owner could point it anywhere", st.Uid, euid),
			Advice:       fmt.Sprintf("if you trust it, chown %d %s; else remove it, or choose a path in a directory only this user may write", euid, path),
			ForeignOwner: int(st.Uid)}
	case kind == unix.S_IFREG && st.Nlink != 1:
		return &UnsafeError{Path: path, Reason: fmt.Sprintf("has %d hard links: another name for this file may be a file someone planted or one that must not be written", st.Nlink),
			Advice:       "remove the other links (find / -xdev -samefile " + path + "), or remove it and let it be created again",
			ForeignOwner: -1}
	}
	return nil
}

func symlinkError(path string) error {
	owner := ""
	var st unix.Stat_t
	if unix.Lstat(path, &st) == nil {
		owner = fmt.Sprintf(" owned by uid %d", st.Uid)
	}
	target, _ := os.Readlink(path)
	return &UnsafeError{Path: path, Reason: fmt.Sprintf("is a symbolic link%s (to %q), which is never followed here: in a shared directory it may be another user's trap", owner, target),
		Advice: "remove the link and point the setting at the real file, or choose a path in a directory only this user may write", ForeignOwner: -1}
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device"
	}
	return fmt.Sprintf("type %#o", mode&unix.S_IFMT)
}

// MakePrivateDir makes dir a private directory of this user: created mode
// 0700 when missing (its missing parents 0755), then checked like
// CheckPrivateDir. An existing directory is never changed: one that is
// not private is refused, not repaired, since someone else may have put
// something in it already.
func MakePrivateDir(dir string) error {
	if parent := filepath.Dir(dir); parent != dir {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mkdir(dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "mkdir", Path: dir, Err: err}
	}
	return CheckPrivateDir(dir)
}

// CheckPrivateDir refuses dir unless it is a directory (not a symbolic
// link to one: lstat), owned by this process's effective uid, that group
// and others may not write. A directory another user owns, or may write,
// can hold a socket or a file that user planted. Read and search bits for
// others are allowed: they let nobody put anything there (the sockets in
// it are 0600, and their peers are checked by uid), and refusing them
// would refuse the directories of systemd's RuntimeDirectoryMode=0755 and
// Go's t.TempDir alike. The directories MakePrivateDir creates are 0700.
func CheckPrivateDir(dir string) error {
	owner, err := CheckDir(dir)
	if err != nil {
		return err
	}
	if euid := os.Geteuid(); owner != euid {
		return &UnsafeError{Path: dir, Reason: fmt.Sprintf("belongs to uid %d, not to this user (uid %d): it may hold a socket or file that user planted", owner, euid),
			Advice: "remove it (as root: rm -r " + dir + "), or set XDG_RUNTIME_DIR, or choose another path", ForeignOwner: owner}
	}
	return nil
}

// CheckDir is CheckPrivateDir but for the owner, whom it returns: dir is a
// directory (lstat: not a symbolic link) that only its owner may write.
func CheckDir(dir string) (owner int, err error) {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return -1, &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	perm := st.Mode & 0o7777
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		target, _ := os.Readlink(dir)
		return -1, &UnsafeError{Path: dir, Reason: fmt.Sprintf("is a symbolic link owned by uid %d (to %q), not a private directory", st.Uid, target),
			Advice: "remove it, or point the setting at the real directory", ForeignOwner: -1}
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return -1, &UnsafeError{Path: dir, Reason: fmt.Sprintf("is %s, not a directory", fileType(st.Mode)), Advice: "remove it", ForeignOwner: -1}
	case perm&0o022 != 0:
		return -1, &UnsafeError{Path: dir, Reason: fmt.Sprintf("has mode %04o: group or others may write in it", perm),
			Advice: fmt.Sprintf("chmod 0700 %s if nobody else could have put anything in it, else remove it", dir), ForeignOwner: -1}
	}
	return int(st.Uid), nil
}
