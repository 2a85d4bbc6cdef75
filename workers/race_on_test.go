//go:build race

package workers

// raceEnabled: the race detector keeps shadow memory for every byte the
// program touches, several times the heap, so an RSS budget does not
// apply under it (TestBurstMemoryGivenBack).
const raceEnabled = true
