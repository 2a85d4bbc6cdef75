package shm

import (
	"errors"
	"fmt"
	"os"

	"github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"
)

// Reader reads a region without locking or writing: it maps the file
// read-only. A Reader is safe for concurrent use.
type Reader struct {
	path string
	f    *os.File
	mem  mmap.MMap
}

// OpenReader opens the region file at path for reading. A truncated,
// foreign or half-written file is an error naming the path and what to do.
func OpenReader(path string) (*Reader, error) {
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open region: %w (is hotproxy running with this base-id?)", err)
	}
	r := &Reader{path: path, f: f}
	if err := r.open(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Reader) open() error {
	size, err := r.size()
	if err != nil {
		return err
	}
	if size < HeaderSize {
		return r.wrap(formatErr("file is %d bytes, shorter than the %d-byte header (truncated)", size, HeaderSize))
	}
	m, err := mmap.MapRegion(r.f, int(size), mmap.RDONLY, 0, 0)
	if err != nil {
		return fmt.Errorf("shm: region %s: mmap: %w", r.path, err)
	}
	r.mem = m
	_, err = r.header()
	return err
}

func (r *Reader) size() (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(r.f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("shm: region %s: %w", r.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, fmt.Errorf("shm: region %s: not a regular file (%s)", r.path, adviceForeign)
	}
	return st.Size, nil
}

func (r *Reader) wrap(err error) error {
	err = explainFault(err, r.f, len(r.mem))
	if errors.Is(err, errNotReady) {
		return fmt.Errorf("shm: region %s: %w (retry in a moment; %s)", r.path, err, adviceForeign)
	}
	var fe *FormatError
	if errors.As(err, &fe) {
		return fmt.Errorf("shm: region %s: %w (%s)", r.path, err, adviceForeign)
	}
	return fmt.Errorf("shm: region %s: %w", r.path, err)
}

// header validates the header against the current file size: the file may
// have been truncated since it was mapped, and the header may claim more.
func (r *Reader) header() (g geometry, err error) {
	size, err := r.size()
	if err != nil {
		return geometry{}, err
	}
	mem := []byte(r.mem)
	if int64(len(mem)) > size {
		mem = mem[:max(size, 0)]
	}
	err = guardFault(func() error {
		var err error
		g, err = parseHeader(mem)
		return err
	})
	if err != nil {
		return geometry{}, r.wrap(err)
	}
	return g, nil
}

// Snapshot returns every stat with its value and the owner table. It
// retries (bounded) while an allocation or fold is in progress.
func (r *Reader) Snapshot() (*Snapshot, error) {
	if r.mem == nil {
		return nil, os.ErrClosed
	}
	g, err := r.header()
	if err != nil {
		return nil, err
	}
	var s *Snapshot
	err = guardFault(func() error {
		var err error
		s, err = readRetry(r.mem[:g.totalSize], g, r.ownerDead)
		return err
	})
	if err != nil {
		return nil, r.wrap(err)
	}
	s.Path = r.path
	return s, nil
}

// ownerDead asks the kernel whether owner slot s's generation is gone:
// its owner lock is free. An error asking is taken as alive (the table's
// word), never as a death the reader cannot prove.
func (r *Reader) ownerDead(s uint64) bool {
	held, err := ofdLockedRead(r.f, ownerLockBase+int64(s))
	return err == nil && !held
}

// Path returns the region file's path.
func (r *Reader) Path() string { return r.path }

// Close unmaps and closes the file.
func (r *Reader) Close() error {
	var errs []error
	if r.mem != nil {
		errs = append(errs, r.mem.Unmap())
		r.mem = nil
	}
	if r.f != nil {
		errs = append(errs, r.f.Close())
		r.f = nil
	}
	return errors.Join(errs...)
}
