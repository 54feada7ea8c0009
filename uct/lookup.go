package uct

import (
	"errors"
	"fmt"
	"sort"
)

// TLIface is an opened transport resource: the unit Lookup ranks.
type TLIface struct {
	Component string
	MD        MD
	Resource  TLResource
	Iface     Iface
	Attr      IfaceAttr
}

// Name is "tl/device".
func (t *TLIface) Name() string { return t.Resource.Name() }

// Address is what a peer needs to reach this iface.
func (t *TLIface) Address() TLAddress {
	return TLAddress{TL: t.Resource.TL, Device: t.Resource.Device,
		DevAddr: t.Iface.DeviceAddress(), IfaceAddr: t.Iface.IfaceAddress()}
}

// TLAddress is a transport address as advertised to a peer.
type TLAddress struct {
	TL, Device         string
	DevAddr, IfaceAddr []byte
}

// Ifaces is the result of OpenIfaces; Close releases every iface and MD.
type Ifaces struct {
	List []*TLIface
	mds  []MD
	// Skipped lists resources that were not opened and why (unavailable
	// component, disabled by config, open error).
	Skipped []error
}

// OpenIfaces opens an iface on every available resource allowed by cfg, on
// worker w (the seed's resource lookup: query components, open MDs, query TL
// resources, open ifaces, query attributes).
func OpenIfaces(w *Worker, cfg *Config, p IfaceParams) *Ifaces {
	if cfg == nil {
		cfg = w.Config()
	}
	if p.Config == nil {
		p.Config = cfg
	}
	out := &Ifaces{}
	for _, ci := range Components() {
		if ci.Err != nil {
			out.Skipped = append(out.Skipped, fmt.Errorf("%s: %w", ci.Component.Name(), ci.Err))
			continue
		}
		for _, mr := range ci.Resources {
			md, err := ci.Component.OpenMD(mr.Name, cfg)
			if err != nil {
				out.Skipped = append(out.Skipped, fmt.Errorf("%s/%s: open md: %w", ci.Component.Name(), mr.Name, err))
				continue
			}
			tls, err := md.TLResources()
			if err != nil {
				out.Skipped = append(out.Skipped, fmt.Errorf("%s/%s: %w", ci.Component.Name(), mr.Name, err))
			}
			used := false
			for _, tl := range tls {
				if !cfg.TLAllowed(ci.Component.Name(), tl.TL) {
					out.Skipped = append(out.Skipped, fmt.Errorf("%s: disabled by RDMANET_TLS", tl.Name()))
					continue
				}
				ifc, err := md.OpenIface(w, tl, p)
				if err != nil {
					out.Skipped = append(out.Skipped, fmt.Errorf("%s: open iface: %w", tl.Name(), err))
					continue
				}
				used = true
				out.List = append(out.List, &TLIface{Component: ci.Component.Name(), MD: md,
					Resource: tl, Iface: ifc, Attr: ifc.Attr()})
			}
			if used {
				out.mds = append(out.mds, md)
			} else {
				md.Close()
			}
		}
	}
	return out
}

// Close closes every iface, then every MD.
func (s *Ifaces) Close() error {
	var errs []error
	for _, t := range s.List {
		errs = append(errs, t.Iface.Close())
	}
	for _, md := range s.mds {
		errs = append(errs, md.Close())
	}
	s.List, s.mds = nil, nil
	return errors.Join(errs...)
}

// Rank sorts ts by estimated time to deliver msgSize bytes, lowest first;
// higher Priority breaks ties.
func Rank(ts []*TLIface, msgSize int) {
	sort.SliceStable(ts, func(i, j int) bool {
		a, b := ts[i].Attr.EstimateTime(msgSize), ts[j].Attr.EstimateTime(msgSize)
		if a != b {
			return a < b
		}
		return ts[i].Attr.Priority > ts[j].Attr.Priority
	})
}

// Select picks, among local ifaces, the one with the lowest estimate for
// msgSize that reaches one of the peer's addresses of the same transport.
// It returns ErrUnreachable when none does.
func Select(local []*TLIface, peer []TLAddress, msgSize int) (*TLIface, TLAddress, error) {
	ranked := append([]*TLIface(nil), local...)
	Rank(ranked, msgSize)
	for _, l := range ranked {
		for _, pa := range peer {
			if pa.TL == l.Resource.TL && l.Iface.IsReachable(pa.DevAddr, pa.IfaceAddr) {
				return l, pa, nil
			}
		}
	}
	return nil, TLAddress{}, ErrUnreachable
}
