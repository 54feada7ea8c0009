package ib_test

import (
	"errors"
	"os"
	"testing"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/uctest"

	_ "github.com/gouct/gouct/uct/ib"
)

// inVM reports the Soft-RoCE VM (scripts/rxevm), where RDMA must work.
func inVM() bool { return os.Getenv("RXEVM") == "1" }

// env returns the variable or def.
func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// devA and devB are the resources the two sides of the pair tests use:
// IBTEST_DEV_A / IBTEST_DEV_B, by default both rxe0:1 (loopback);
// scripts/vm-test.sh sets rxe1:1 / rxe2:1 for the veth pair.
func devA() string { return env("IBTEST_DEV_A", "rxe0:1") }
func devB() string { return env("IBTEST_DEV_B", devA()) }

// needRDMA skips on a host without RDMA and fails inside the VM.
func needRDMA(t testing.TB) {
	t.Helper()
	c, ok := uct.LookupComponent("ib")
	if !ok {
		t.Fatal("component ib not registered")
	}
	if _, err := c.MDResources(); err != nil {
		if inVM() {
			t.Fatalf("RXEVM=1 but no RDMA: %v", err)
		}
		t.Skipf("no RDMA here: %v", err)
	}
}

func TestComponentReportsAvailability(t *testing.T) {
	var info *uct.ComponentInfo
	for _, ci := range uct.Components() {
		if ci.Component.Name() == "ib" {
			info = &ci
		}
	}
	if info == nil {
		t.Fatal("component ib not listed by uct.Components")
	}
	if info.Err != nil {
		if !errors.Is(info.Err, uct.ErrUnavailable) {
			t.Errorf("unavailable component's error %v does not wrap ErrUnavailable", info.Err)
		}
		if inVM() {
			t.Fatalf("RXEVM=1 but ib is unavailable: %v", info.Err)
		}
		t.Logf("ib unavailable on this host, as expected without RDMA: %v", info.Err)
		return
	}
	if len(info.Resources) == 0 {
		t.Fatalf("ib available without MD resources")
	}
	t.Logf("ib MDs: %v", info.Resources)
}

// TestSuite runs the shared uct suite on rc_verbs (loopback on one device).
func TestSuite(t *testing.T) {
	needRDMA(t)
	uctest.RunOptions(t, uctest.Options{TL: "rc_verbs", Device: devA()})
}

func BenchmarkPingPong8(b *testing.B) {
	needRDMA(b)
	uctest.BenchPingPongOptions(b, uctest.Options{TL: "rc_verbs", Device: devA()}, 8)
}

func BenchmarkBandwidth64K(b *testing.B) {
	needRDMA(b)
	uctest.BenchBandwidthOptions(b, uctest.Options{TL: "rc_verbs", Device: devA()}, 64<<10)
}
