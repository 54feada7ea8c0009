//go:build linux

package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

var sysfsRoot = "/sys"

// ibPortInfo reads one RDMA port from sysfs under root: state, physical
// state, link layer, rate (speed × width) and the bandwidth it implies
// (8b/10b encoding up to QDR, 64b/66b from FDR), GIDs with their types and
// network devices, the netdev MTU and the IB MTU it allows (RoCE), and LAG
// (a bonding netdev and its slaves). Missing files are left out.
func ibPortInfo(root, dev string, port int) map[string]any {
	dir := filepath.Join(root, "class", "infiniband", dev, "ports", strconv.Itoa(port))
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	out := map[string]any{}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	for key, rel := range map[string]string{"state": "state", "phys_state": "phys_state", "link_layer": "link_layer", "rate": "rate"} {
		if v := read(rel); v != "" {
			out[key] = v
		}
	}
	if r, ok := out["rate"].(string); ok {
		if bw, ok := rateBandwidth(r); ok {
			out["bandwidth_mbs"] = bw
		}
	}
	var gids []string
	ndevs := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(dir, "gids"))
	idx := make([]int, 0, len(ents))
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			idx = append(idx, n)
		}
	}
	sort.Ints(idx)
	for _, i := range idx {
		g := read(filepath.Join("gids", strconv.Itoa(i)))
		if g == "" || strings.Trim(g, "0:") == "" {
			continue // empty table slot
		}
		s := fmt.Sprintf("%d %s", i, g)
		if t := read(filepath.Join("gid_attrs", "types", strconv.Itoa(i))); t != "" {
			s += " " + t
		}
		if nd := read(filepath.Join("gid_attrs", "ndevs", strconv.Itoa(i))); nd != "" {
			s += " " + nd
			ndevs[nd] = true
		}
		gids = append(gids, s)
	}
	if len(gids) > 0 {
		out["gids"] = strings.Join(gids, "; ")
	}
	names := make([]string, 0, len(ndevs))
	for nd := range ndevs {
		names = append(names, nd)
	}
	sort.Strings(names)
	for _, nd := range names {
		net := filepath.Join(root, "class", "net", nd)
		if b, err := os.ReadFile(filepath.Join(net, "mtu")); err == nil {
			if m, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				out["netdev"] = nd
				out["netdev_mtu"] = m
				out["ib_mtu"] = ibMTU(m)
			}
		}
		if b, err := os.ReadFile(filepath.Join(net, "bonding", "slaves")); err == nil {
			out["lag"] = fmt.Sprintf("%s: %s", nd, strings.Join(strings.Fields(string(b)), ","))
		}
	}
	return out
}

var rateRE = regexp.MustCompile(`^([0-9.]+) Gb/sec \((\d+)X ?([A-Z0-9]*)\)`)

// rateBandwidth turns a sysfs rate ("100 Gb/sec (4X EDR)", already
// signalling rate × width) into data bandwidth in MB/s.
func rateBandwidth(rate string) (float64, bool) {
	m := rateRE.FindStringSubmatch(rate)
	if m == nil {
		return 0, false
	}
	gbps, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, false
	}
	enc := 64.0 / 66
	switch m[3] {
	case "SDR", "DDR", "QDR":
		enc = 0.8
	}
	return math.Round(gbps*1e9*enc/8/1e6*10) / 10, true
}

// ibMTU is the largest IB MTU (256..4096) a RoCE netdev MTU carries.
func ibMTU(netdevMTU int) int {
	best := 0
	for m := 256; m <= 4096; m *= 2 {
		if m <= netdevMTU {
			best = m
		}
	}
	return best
}
