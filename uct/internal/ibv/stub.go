//go:build !linux || !cgo || noverbs

package ibv

// Load reports that this build has no verbs support.
func Load() error { return ErrNotBuilt }
