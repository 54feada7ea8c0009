package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
)

// printText writes the report in ucx_info's style: '#'-prefixed, indented,
// one fact per line, in a fixed order, so scripts may grep it.
func (c *command) printText(r *Report) {
	w := c.stdout
	if b := r.Build; b != nil {
		fmt.Fprintf(w, "# rdmanet-info %s %s (%s)\n", b.Module, b.Version, b.GoVersion)
		fmt.Fprintf(w, "#   os/arch:    %s/%s\n", b.OS, b.Arch)
		fmt.Fprintf(w, "#   cgo:        %s\n", yesNo(b.CGO))
		fmt.Fprintf(w, "#   tags:       %s\n", orNone(b.Tags))
		fmt.Fprintf(w, "#   verbs:      %s\n", yesNo(b.Verbs))
		fmt.Fprintf(w, "#   components: %s\n", strings.Join(b.Components, ","))
		if b.Revision != "" {
			mod := ""
			if b.Modified {
				mod = " (modified)"
			}
			fmt.Fprintf(w, "#   revision:   %s %s%s\n", b.Revision, b.Time, mod)
		}
		fmt.Fprintln(w, "#")
	}
	for _, comp := range r.Components {
		printComponent(w, comp)
	}
	for _, v := range r.Config {
		if v.Doc != "" {
			fmt.Fprintln(w, "#")
			for _, l := range wrap(v.Doc, 76) {
				fmt.Fprintf(w, "# %s\n", l)
			}
			fmt.Fprintf(w, "# default: %s (Config.%s)\n", v.Default, v.Field)
		}
		fmt.Fprintf(w, "%s=%s\n", v.Env, v.Value)
	}
}

func printComponent(w io.Writer, comp ComponentReport) {
	if comp.Available {
		fmt.Fprintf(w, "# Component: %s\n", comp.Name)
	} else {
		fmt.Fprintf(w, "# Component: %s (unavailable: %s)\n", comp.Name, comp.Reason)
	}
	for _, md := range comp.MDs {
		fmt.Fprintf(w, "#   Memory domain: %s\n", md.Name)
		if md.Error != "" {
			fmt.Fprintf(w, "#     error: %s\n", md.Error)
		}
		if a := md.Attr; a != nil {
			fmt.Fprintf(w, "#     flags:      %s\n", orNone(a.Flags))
			fmt.Fprintf(w, "#     reg cost:   %.0f ns + %.3f ns/KiB\n", a.RegCostNs, a.RegCostNsKB)
			if a.MaxReg == 0 || a.MaxReg >= math.MaxInt64 {
				fmt.Fprintf(w, "#     max reg:    unlimited\n")
			} else {
				fmt.Fprintf(w, "#     max reg:    %s\n", size(int64(a.MaxReg)))
			}
			fmt.Fprintf(w, "#     rkey size:  %d\n", a.RKeySize)
		}
		for _, t := range md.Transports {
			printTransport(w, t)
		}
	}
	fmt.Fprintln(w, "#")
}

func printTransport(w io.Writer, t TransportReport) {
	allowed := "allowed"
	if !t.Allowed {
		allowed = "disabled by RDMANET_TLS"
	}
	fmt.Fprintf(w, "#     Transport: %s (device type %s, %s)\n", t.Name, t.Type, allowed)
	if t.Error != "" {
		fmt.Fprintf(w, "#       error: %s\n", t.Error)
	}
	if a := t.Iface; a != nil {
		fmt.Fprintf(w, "#       capabilities: %s\n", orNone(a.Caps))
		fmt.Fprintf(w, "#       max short:    %s\n", limit(a.MaxShort))
		fmt.Fprintf(w, "#       max bcopy:    %s\n", limit(a.MaxBcopy))
		fmt.Fprintf(w, "#       max zcopy:    %s (header %s, iov %d)\n", limit(a.MaxZcopy), limit(a.MaxHeader), a.MaxIOV)
		fmt.Fprintf(w, "#       max put/get:  %s / %s\n", limit(a.MaxPut), limit(a.MaxGet))
		fmt.Fprintf(w, "#       latency:      %.0f ns + %.1f ns per endpoint\n", a.LatencyNs, a.LatencyPerEPNs)
		fmt.Fprintf(w, "#       bandwidth:    %.2f MB/s dedicated + %.2f MB/s shared\n", a.BandwidthMBs, a.SharedBWMBs)
		fmt.Fprintf(w, "#       overhead:     %.0f ns\n", a.OverheadNs)
		fmt.Fprintf(w, "#       estimate:     %.0f ns (64 B), %.0f ns (1 MiB)\n", a.Estimate64Ns, a.Estimate1MiBNs)
		fmt.Fprintf(w, "#       address:      device %d B, iface %d B, ep %d B\n", a.DeviceAddrLen, a.IfaceAddrLen, a.EPAddrLen)
		fmt.Fprintf(w, "#       priority:     %d\n", a.Priority)
	}
	if len(t.DeviceInfo) > 0 {
		keys := make([]string, 0, len(t.DeviceInfo))
		for k := range t.DeviceInfo {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "#       device:\n")
		for _, k := range keys {
			fmt.Fprintf(w, "#         %-12s %v\n", k+":", t.DeviceInfo[k])
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func limit(n int) string {
	if n == 0 {
		return "-"
	}
	return size(int64(n))
}

// size prints n bytes exactly, with a binary suffix when it divides evenly.
func size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}

// wrap splits s into lines of at most width runes at spaces.
func wrap(s string, width int) []string {
	var out []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			out = append(out, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		out = append(out, line)
	}
	return out
}
