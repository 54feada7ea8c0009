package benchclock

// Ticks reads the time-stamp counter (RDTSC, like perftest's get_cycles).
func Ticks() int64
