//go:build !race

package rdmanet_test

const raceOn = false
