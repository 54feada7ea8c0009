//go:build linux && cgo && !noverbs

package ib

import "github.com/gouct/gouct/uct"

// KillMD runs what a removed device triggers (md.kill), for tests.
func KillMD(m uct.MD, err error) { m.(*md).kill(err) }

// EPQP names an endpoint's QP, for tests.
func EPQP(e uct.EP) TestingQP {
	x := e.(*ep)
	return TestingQP{Device: x.i.md.name, QPN: x.qpn}
}

// CheckMD runs one device check (async events, removal), as the ifaces'
// event goroutines do 5 times a second, for tests.
func CheckMD(m uct.MD) { m.(*md).check() }
