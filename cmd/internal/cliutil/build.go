package cliutil

import (
	"runtime"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/gouct/gouct/uct"
)

// BuildInfo is what `-v` prints: the module version and the build settings
// that decide which transports are compiled in.
type BuildInfo struct {
	Module    string `json:"module"`
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	CGO       bool   `json:"cgo"`  // CGO_ENABLED=1 at build time
	Tags      string `json:"tags"` // -tags given to go build
	// Verbs reports whether the rc_verbs transport is compiled in: built
	// with cgo, without the noverbs tag, and an "ib" component registered.
	Verbs      bool              `json:"verbs"`
	Components []string          `json:"components"` // registered components, sorted
	Revision   string            `json:"vcs_revision,omitempty"`
	Time       string            `json:"vcs_time,omitempty"`
	Modified   bool              `json:"vcs_modified,omitempty"`
	Settings   map[string]string `json:"settings,omitempty"` // every build setting
}

// ReadBuildInfo collects BuildInfo from runtime/debug and the uct registry.
func ReadBuildInfo() BuildInfo {
	b := BuildInfo{Module: "github.com/gouct/gouct", Version: "(devel)", GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH, Settings: map[string]string{}}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Path != "" {
			b.Module = bi.Main.Path
		}
		if bi.Main.Version != "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			b.Settings[s.Key] = s.Value
			switch s.Key {
			case "CGO_ENABLED":
				b.CGO = s.Value == "1"
			case "-tags":
				b.Tags = s.Value
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.time":
				b.Time = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	for _, ci := range uct.Components() {
		b.Components = append(b.Components, ci.Component.Name())
	}
	sort.Strings(b.Components)
	_, ib := uct.LookupComponent("ib")
	noverbs := false
	for _, t := range strings.Split(b.Tags, ",") {
		noverbs = noverbs || t == "noverbs"
	}
	b.Verbs = b.CGO && ib && !noverbs && b.OS == "linux"
	return b
}
