//go:build race

package stats

// raceEnabled: the race detector runs sync/atomic operations in its C
// runtime on the system stack, where a memory fault cannot become a panic:
// a truncation that lands between its early probe of the address and the
// operation itself is fatal there, never in a normal build.
const raceEnabled = true
