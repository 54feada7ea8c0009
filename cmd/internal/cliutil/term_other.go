//go:build !linux

package cliutil

import "os"

// IsTerminal reports whether f looks like a terminal (a character device).
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0 && f.Name() != os.DevNull
}
