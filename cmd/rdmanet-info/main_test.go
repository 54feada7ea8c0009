package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/gouct/gouct/uct"
	"go.uber.org/goleak"
)

func runInfo(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestJSONDevices(t *testing.T) {
	out, errs, code := runInfo(t, "-d", "-v", "-json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var rep Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if rep.Build == nil || rep.Build.GoVersion == "" {
		t.Fatalf("no build info: %s", out)
	}
	if rep.Config != nil {
		t.Fatalf("config printed without -c: %s", out)
	}
	want := uct.Components()
	if len(rep.Components) != len(want) {
		t.Fatalf("%d components, registry has %d", len(rep.Components), len(want))
	}
	var self *TransportReport
	sawRC := false
	for i, c := range rep.Components {
		if c.Name != want[i].Component.Name() {
			t.Fatalf("component %d is %q, want %q (sorted)", i, c.Name, want[i].Component.Name())
		}
		if c.Available != (want[i].Err == nil) || (!c.Available && c.Reason == "") {
			t.Fatalf("component %s: available=%v reason=%q, registry err %v", c.Name, c.Available, c.Reason, want[i].Err)
		}
		for _, md := range c.MDs {
			for j := range md.Transports {
				tr := &md.Transports[j]
				if tr.TL == "self" {
					self = tr
				}
				sawRC = sawRC || (tr.TL == "rc_verbs" && tr.Iface != nil)
				// RDMA ports (in the Soft-RoCE VM) come with their sysfs view.
				if tr.TL == "rc_verbs" && (tr.DeviceInfo["state"] == nil || tr.DeviceInfo["link_layer"] == nil || tr.DeviceInfo["gids"] == nil) {
					t.Errorf("%s: device info incomplete: %v", tr.Name, tr.DeviceInfo)
				}
			}
		}
	}
	if os.Getenv("RXEVM") == "1" && !sawRC {
		t.Errorf("RXEVM=1 but no rc_verbs port listed: %s", out)
	}
	if self == nil || self.Iface == nil {
		t.Fatalf("self transport missing or not opened: %s", out)
	}
	ia := self.Iface
	if !strings.Contains(ia.Caps, "am_short") || ia.MaxShort <= 0 || ia.MaxBcopy <= 0 || ia.IfaceAddrLen <= 0 ||
		ia.LatencyNs <= 0 || ia.BandwidthMBs <= 0 || len(ia.CapList) == 0 {
		t.Fatalf("self iface attributes incomplete: %+v", ia)
	}
}

func TestConfig(t *testing.T) {
	t.Setenv("RDMANET_TLS", "^tcp")
	t.Setenv("RDMANET_RX_WINDOW", "8M")
	out, errs, code := runInfo(t, "-c")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"RDMANET_TLS=^tcp\n", "RDMANET_RX_WINDOW=8388608\n", "RDMANET_PROGRESS_SPIN=100µs\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("-c output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Component:") || strings.Contains(out, "# Transports to use") {
		t.Errorf("-c printed more than the configuration:\n%s", out)
	}

	out, _, code = runInfo(t, "-f", "-json")
	if code != 0 {
		t.Fatalf("-f -json exit %d", code)
	}
	var rep Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	fields := uct.DefaultConfig().Fields()
	if len(rep.Config) != len(fields) {
		t.Fatalf("%d variables, Config has %d", len(rep.Config), len(fields))
	}
	for i, v := range rep.Config {
		if v.Env != fields[i].Env || v.Doc == "" || v.Default != fields[i].Default {
			t.Errorf("variable %d: %+v, want env %s with doc and default", i, v, fields[i].Env)
		}
	}
	if rep.Config[0].Value != "^tcp" {
		t.Errorf("RDMANET_TLS value %q, want ^tcp", rep.Config[0].Value)
	}
}

func TestBadConfigValue(t *testing.T) {
	t.Setenv("RDMANET_RX_WINDOW", "lots")
	_, errs, code := runInfo(t, "-c")
	if code != 1 || !strings.Contains(errs, "RDMANET_RX_WINDOW") {
		t.Fatalf("exit %d, stderr %q: want 1 naming the variable", code, errs)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-nope"}, {"extra"}, {"-d", "-json=maybe"}} {
		out, errs, code := runInfo(t, args...)
		if code != 2 || out != "" || !strings.Contains(errs, "usage: rdmanet-info") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 with usage on stderr", args, code, out, errs)
		}
	}
	if _, _, code := runInfo(t, "-h"); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
}

func TestTextStable(t *testing.T) {
	a, _, _ := runInfo(t, "-d")
	b, _, _ := runInfo(t, "-d")
	if a != b {
		t.Fatalf("two runs differ:\n%s\n---\n%s", a, b)
	}
	if !strings.Contains(a, "# Component: self\n") || !strings.Contains(a, "#     Transport: self/memory") {
		t.Fatalf("text output lacks the self component:\n%s", a)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
