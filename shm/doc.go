// Package shm is hotproxy's shared-memory statistics region: the byte
// layout, mapping, allocation under an OFD lock, folding of exited and
// crashed generations, and a lock-free read-only reader.
//
// shm knows bytes, not stats: it stores named records of three kinds
// (counter, gauge, histogram) and per-writer lanes of 64-bit words. The
// stats package builds the stats model on top of it; the CLI reads a region
// with [OpenReader] without talking to any process.
//
// A region is one sparse file on tmpfs (default [DefaultPath]) whose
// capacity is reserved up front; only touched pages cost memory. Each live
// process generation owns an owner slot with its own lanes (lane 0 for the
// main goroutine, lanes 1..N for workers by convention of the stats
// package). A counter's value is its retired total plus the sum of the lanes
// of the live owners; a gauge's value is the sum of the live owners' lanes
// (or of the newest owner's lanes only, for [GaugeNewest]). When an owner
// exits ([Region.Close]) or dies, its counter lanes are folded into the
// retired totals under the allocation lock and a sequence number, so a
// reader never sees a count twice or loses one. The byte layout is
// documented in LAYOUT.md next to this file.
//
// Linux only; on other platforms Open and OpenReader return an error
// wrapping [errors.ErrUnsupported]. The decoding of region bytes
// ([Decode]) is portable.
package shm
