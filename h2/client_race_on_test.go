//go:build race

package h2

const clientRaceEnabled = true
