package cliutil

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// Profiles runs the -cpuprofile / -memprofile flags of a command. The zero
// value (both paths empty) does nothing. Not safe for concurrent use: the
// command's main goroutine calls Start once and Stop once.
type Profiles struct {
	CPU, Mem string
	cpuFile  *os.File
}

// Start begins CPU profiling when p.CPU is set.
func (p *Profiles) Start() error {
	if p.CPU == "" {
		return nil
	}
	f, err := os.Create(p.CPU)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("cpu profile: %w", err)
	}
	p.cpuFile = f
	return nil
}

// Stop ends CPU profiling and writes the heap profile when p.Mem is set. It
// is idempotent.
func (p *Profiles) Stop() error {
	var errs []error
	if p.cpuFile != nil {
		pprof.StopCPUProfile()
		errs = append(errs, p.cpuFile.Close())
		p.cpuFile = nil
	}
	if p.Mem != "" {
		f, err := os.Create(p.Mem)
		if err != nil {
			errs = append(errs, fmt.Errorf("mem profile: %w", err))
		} else {
			runtime.GC() // up-to-date statistics
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				errs = append(errs, fmt.Errorf("mem profile: %w", err))
			}
			errs = append(errs, f.Close())
		}
		p.Mem = ""
	}
	return errors.Join(errs...)
}
