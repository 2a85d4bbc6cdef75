// Package integration holds hotproxy's end-to-end tests: each builds the
// real binary (see package harness), runs it on loopback against real
// backends, and measures what clients see, with package loadgen where load
// matters. It has no code of its own outside tests.
//
// Run them with `go test ./integration/...` (or `make integration`). The
// binary is built once per test process from ./cmd/hotproxy; set
// HOTPROXY_BIN=/path/to/hotproxy to test a prebuilt one instead. Every test
// allocates its own loopback ports and runs in parallel, except the one
// that needs the embedded default config's fixed ports (it skips when they
// are taken).
package integration
