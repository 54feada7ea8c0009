// Command uct-pingpong bounces an 8-byte active message between two
// endpoints of the best available in-process transport and prints the
// round-trip latency. It is the smallest complete use of the uct API.
package main

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/gouct/gouct/uct"
	_ "github.com/gouct/gouct/uct/self"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "uct-pingpong:", err)
		os.Exit(1)
	}
}

func run() error {
	const iters = 20000
	w := uct.NewWorker(nil)
	defer w.Close()
	ifs := uct.OpenIfaces(w, nil, uct.IfaceParams{})
	defer ifs.Close()
	var ti *uct.TLIface
	for _, t := range ifs.List {
		if t.Attr.Cap.Has(uct.CapConnectToIface | uct.CapAMShort) {
			ti = t
			break
		}
	}
	if ti == nil {
		return fmt.Errorf("no transport (%v)", ifs.Skipped)
	}
	a := ti.Address()
	ep, err := ti.Iface.CreateEP(uct.EPParams{DevAddr: a.DevAddr, IfaceAddr: a.IfaceAddr})
	if err != nil {
		return err
	}
	defer ep.Close()
	pong := make(chan struct{}, 1)
	ti.Iface.SetAMHandler(1, func([]byte) { pong <- struct{}{} })
	lat := make([]time.Duration, 0, iters)
	for i := 0; i < iters; i++ {
		t0 := time.Now()
		for ep.AMShort(1, uint64(i), nil) == uct.ErrNoResource {
		}
		<-pong
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	fmt.Printf("transport %s: %d round trips, p50 %v p99 %v\n", ti.Name(), iters, lat[len(lat)/2], lat[len(lat)*99/100])
	return nil
}
