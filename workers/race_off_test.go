//go:build !race

package workers

// raceEnabled: see race_on_test.go.
const raceEnabled = false
