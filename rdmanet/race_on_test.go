//go:build race

package rdmanet_test

// raceOn: the race detector is on (slower, and at most 8128 goroutines).
const raceOn = true
