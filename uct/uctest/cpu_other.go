//go:build !unix

package uctest

import "time"

func cpuTime() (time.Duration, bool) { return 0, false }
