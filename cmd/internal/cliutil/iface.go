package cliutil

import (
	"strings"

	"github.com/gouct/gouct/uct"
)

// IfaceInfo describes one opened transport interface with stable field
// names: rdmanet-info -d prints it and rdmanet-perf reports the transport it
// measured with it. Units are in the field names.
type IfaceInfo struct {
	Name           string   `json:"name"` // tl/device
	TL             string   `json:"tl"`
	Device         string   `json:"device"`
	DeviceType     string   `json:"device_type"`
	Caps           string   `json:"caps"` // uct.Capability.String
	CapList        []string `json:"cap_list"`
	MaxShort       int      `json:"max_short"`
	MaxBcopy       int      `json:"max_bcopy"`
	MaxZcopy       int      `json:"max_zcopy"`
	MaxHeader      int      `json:"max_header"`
	MaxIOV         int      `json:"max_iov"`
	MaxGet         int      `json:"max_get"`
	MaxPut         int      `json:"max_put"`
	LatencyNs      float64  `json:"latency_ns"`
	LatencyPerEPNs float64  `json:"latency_per_ep_ns"`
	BandwidthMBs   float64  `json:"bandwidth_mbs"`        // dedicated, 10^6 B/s
	SharedBWMBs    float64  `json:"shared_bandwidth_mbs"` // shared among processes per node
	OverheadNs     float64  `json:"overhead_ns"`
	DeviceAddrLen  int      `json:"device_addr_len"`
	IfaceAddrLen   int      `json:"iface_addr_len"`
	EPAddrLen      int      `json:"ep_addr_len"`
	Priority       int      `json:"priority"`
	Estimate64Ns   float64  `json:"estimate_64b_ns"` // IfaceAttr.EstimateTime(64)
	Estimate1MiBNs float64  `json:"estimate_1mib_ns"`
}

// DescribeIface describes the opened iface t.
func DescribeIface(t *uct.TLIface) IfaceInfo {
	a := t.Attr
	caps := a.Cap.String()
	list := []string{}
	if caps != "" {
		list = strings.Split(caps, ",")
	}
	return IfaceInfo{
		Name: t.Name(), TL: t.Resource.TL, Device: t.Resource.Device, DeviceType: t.Resource.Type.String(),
		Caps: caps, CapList: list,
		MaxShort: a.MaxShort, MaxBcopy: a.MaxBcopy, MaxZcopy: a.MaxZcopy, MaxHeader: a.MaxHeader,
		MaxIOV: a.MaxIOV, MaxGet: a.MaxGet, MaxPut: a.MaxPut,
		LatencyNs: a.Latency.C * 1e9, LatencyPerEPNs: a.Latency.M * 1e9,
		BandwidthMBs: a.Bandwidth.Dedicated / 1e6, SharedBWMBs: a.Bandwidth.Shared / 1e6,
		OverheadNs:    a.Overhead * 1e9,
		DeviceAddrLen: a.DeviceAddrLen, IfaceAddrLen: a.IfaceAddrLen, EPAddrLen: a.EPAddrLen,
		Priority:     a.Priority,
		Estimate64Ns: a.EstimateTime(64) * 1e9, Estimate1MiBNs: a.EstimateTime(1<<20) * 1e9,
	}
}

// MDInfo describes a memory domain's attributes.
type MDInfo struct {
	Name        string  `json:"name"`
	Flags       string  `json:"flags"`
	RegCostNs   float64 `json:"reg_cost_ns"`         // fixed part
	RegCostNsKB float64 `json:"reg_cost_ns_per_kib"` // per KiB registered
	MaxReg      uint64  `json:"max_reg"`             // 0: no limit
	RKeySize    int     `json:"rkey_size"`
}

var mdFlagNames = []string{"can_register", "need_memh", "need_rkey", "odp"}

// DescribeMD describes md.
func DescribeMD(md uct.MD) MDInfo {
	a := md.Attr()
	var fl []string
	for i, n := range mdFlagNames {
		if a.Flags&(1<<i) != 0 {
			fl = append(fl, n)
		}
	}
	return MDInfo{Name: md.Name(), Flags: strings.Join(fl, ","), RegCostNs: a.RegCost.C * 1e9,
		RegCostNsKB: a.RegCost.M * 1e9 * 1024, MaxReg: a.MaxReg, RKeySize: a.RKeySize}
}
