// Package safefile opens the files and directories a process (root above
// all) creates in places other users may write: /tmp, /dev/shm, a log
// directory. There, whoever got to the name first can have planted a
// symbolic link (root would create or append to the file it points at), a
// hard link to a file of root's (root would write into it), or a directory
// of their own holding a fake socket. So a file is opened without following
// a link, then checked through its descriptor (fstat: a regular file, owned
// by this user, one link); a private directory must be a real directory,
// owned by this user, that nobody else may enter. Anything else is refused
// with an error that names the path, its owner and what to do.
package safefile

import (
	"errors"
	"fmt"
)

// ErrNotSupported is returned where these checks are not implemented.
var ErrNotSupported = errors.New("safefile: not supported on this platform")

// ErrUnsafe marks a path refused by these checks; the *UnsafeError says why.
var ErrUnsafe = errors.New("refused")

// UnsafeError is a path that is not what this process may safely use.
type UnsafeError struct {
	Path   string
	Reason string // what is wrong, e.g. "is a symbolic link"
	Advice string // what to do
	// ForeignOwner is the uid that owns Path when that is what is wrong
	// (a directory or file of another user), else -1.
	ForeignOwner int
}

// OwnedByRoot reports whether err refuses a path only because root owns
// it, for a process that is not root: not a trap (root could do anything
// anyway), just not this user's, so a caller with other places to try
// (the control socket's candidates) tries the next.
func OwnedByRoot(err error) bool {
	var ue *UnsafeError
	return errors.As(err, &ue) && ue.ForeignOwner == 0
}

func (e *UnsafeError) Error() string {
	return fmt.Sprintf("%s: %s (%s)", e.Path, e.Reason, e.Advice)
}

// Is makes errors.Is(err, ErrUnsafe) true.
func (e *UnsafeError) Is(target error) bool { return target == ErrUnsafe }
