package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/edsrzf/mmap-go"
)

func (r *Region) mapFile(size int64) error {
	m, err := mmap.MapRegion(r.f, int(size), mmap.RDWR, 0, 0)
	if err != nil {
		return fmt.Errorf("shm: region %s: mmap: %w", r.path, err)
	}
	r.mem = m
	r.unmap = m.Unmap
	return nil
}

// create initialises an empty file: size first (sparse), then the header
// with the magic first and the ready word last.
func (r *Region) create(o Options, g geometry) error {
	if err := r.f.Truncate(int64(g.totalSize)); err != nil {
		return fmt.Errorf("shm: region %s: reserve %d bytes: %w", r.path, g.totalSize, err)
	}
	if err := r.f.Chmod(o.Mode); err != nil {
		return fmt.Errorf("shm: region %s: %w", r.path, err)
	}
	if err := r.mapFile(int64(g.totalSize)); err != nil {
		return err
	}
	r.g = g
	r.st(hMagic, Magic)
	atomic.StoreUint64(r.word(hVersion), uint64(LayoutMajor)|uint64(LayoutMinor)<<32)
	for _, f := range [][2]uint64{
		{hLayoutHash, LayoutHash}, {hTotalSize, g.totalSize},
		{hMaxOwners, g.maxOwners}, {hMaxLanes, g.maxLanes}, {hMaxRecords, g.maxRecords},
		{hStringBytes, g.stringBytes}, {hValueBytes, g.valueBytes},
		{hOwnersOff, g.ownersOff}, {hRecordsOff, g.recordsOff}, {hStringsOff, g.stringsOff},
		{hValuesOff, g.valuesOff}, {hLanesOff, g.lanesOff}, {hLaneStride, g.laneStride},
		{hCreated, uint64(time.Now().UnixNano())},
	} {
		r.st(f[0], f[1])
	}
	r.st(hReady, 1)
	r.log.Debug("created region", "path", r.path, "size", g.totalSize)
	return nil
}

func (r *Region) attach(size int64) error {
	if size < HeaderSize {
		return fmt.Errorf("shm: region %s: %w (%s)", r.path,
			formatErr("file is %d bytes, shorter than the %d-byte header (truncated)", size, HeaderSize), adviceForeign)
	}
	if err := r.mapFile(size); err != nil {
		return err
	}
	g, err := parseHeader(r.mem)
	if errors.Is(err, errNotReady) {
		return err
	}
	if err != nil {
		return fmt.Errorf("shm: region %s: %w (%s)", r.path, err, adviceForeign)
	}
	if uint64(size) != g.totalSize {
		return fmt.Errorf("shm: region %s: %w (%s)", r.path,
			formatErr("file is %d bytes, its header says %d", size, g.totalSize), adviceForeign)
	}
	r.g = g
	return nil
}
