package cliutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gouct/gouct/uct"
	_ "github.com/gouct/gouct/uct/self"
)

func TestIsTerminal(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, f := range []*os.File{null, r, w, nil} {
		if IsTerminal(f) {
			t.Errorf("%v reported as a terminal", f)
		}
	}
}

func TestProfiles(t *testing.T) {
	dir := t.TempDir()
	p := Profiles{CPU: filepath.Join(dir, "cpu"), Mem: filepath.Join(dir, "mem")}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	for _, f := range []string{"cpu", "mem"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s profile: %v", f, err)
		}
	}
	bad := Profiles{CPU: filepath.Join(dir, "no", "such", "dir")}
	if err := bad.Start(); err == nil {
		t.Error("profile into a missing directory started")
	}
}

func TestBuildInfo(t *testing.T) {
	b := ReadBuildInfo()
	if b.GoVersion == "" || b.OS == "" || len(b.Components) == 0 || b.Components[0] == "" {
		t.Fatalf("%+v", b)
	}
	if b.Verbs && !b.CGO {
		t.Errorf("verbs without cgo: %+v", b)
	}
}

func TestDescribe(t *testing.T) {
	w := uct.NewWorker(nil)
	defer w.Close()
	ifs := uct.OpenIfaces(w, nil, uct.IfaceParams{})
	defer ifs.Close()
	for _, ti := range ifs.List {
		d := DescribeIface(ti)
		if d.Name != ti.Name() || d.Caps != ti.Attr.Cap.String() || len(d.CapList) == 0 || d.MaxShort != ti.Attr.MaxShort ||
			d.LatencyNs != ti.Attr.Latency.C*1e9 || d.Estimate64Ns <= d.LatencyNs-1 {
			t.Errorf("%s: %+v", ti.Name(), d)
		}
		m := DescribeMD(ti.MD)
		if m.Name != ti.MD.Name() || (ti.MD.Attr().Flags&uct.MDNeedRKey != 0) != strings.Contains(m.Flags, "need_rkey") {
			t.Errorf("md %s: %+v", ti.MD.Name(), m)
		}
	}
	if len(ifs.List) == 0 {
		t.Fatal("no iface opened (self is linked)")
	}
}
