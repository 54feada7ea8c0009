//go:build !amd64

package benchclock

import "time"

var base = time.Now()

// Ticks is the monotonic clock in nanoseconds where no counter is read.
func Ticks() int64 { return int64(time.Since(base)) }
