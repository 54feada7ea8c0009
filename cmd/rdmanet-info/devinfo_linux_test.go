//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestIBPortInfo(t *testing.T) {
	root := t.TempDir()
	put := func(rel, s string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	port := "class/infiniband/rxe0/ports/1/"
	put(port+"state", "4: ACTIVE")
	put(port+"phys_state", "5: LinkUp")
	put(port+"link_layer", "Ethernet")
	put(port+"rate", "100 Gb/sec (4X EDR)")
	put(port+"gids/0", "fe80:0000:0000:0000:0250:56ff:fe8a:1234")
	put(port+"gids/1", "0000:0000:0000:0000:0000:ffff:0a00:0002")
	put(port+"gids/2", "0000:0000:0000:0000:0000:0000:0000:0000")
	put(port+"gid_attrs/types/0", "IB/RoCE v1")
	put(port+"gid_attrs/types/1", "RoCE v2")
	put(port+"gid_attrs/ndevs/0", "bond0")
	put(port+"gid_attrs/ndevs/1", "bond0")
	put("class/net/bond0/mtu", "1500")
	put("class/net/bond0/bonding/slaves", "eth0 eth1")

	got := ibPortInfo(root, "rxe0", 1)
	want := map[string]any{
		"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "Ethernet", "rate": "100 Gb/sec (4X EDR)",
		"bandwidth_mbs": 12121.2, "netdev": "bond0", "netdev_mtu": 1500, "ib_mtu": 1024, "lag": "bond0: eth0,eth1",
		"gids": "0 fe80:0000:0000:0000:0250:56ff:fe8a:1234 IB/RoCE v1 bond0; 1 0000:0000:0000:0000:0000:ffff:0a00:0002 RoCE v2 bond0",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d keys %v, want %d", len(got), got, len(want))
	}
	if ibPortInfo(root, "rxe0", 2) != nil || ibPortInfo(root, "mlx5_0", 1) != nil {
		t.Error("info for a port that does not exist")
	}
	if bw, ok := rateBandwidth("40 Gb/sec (4X QDR)"); !ok || bw != 4000 {
		t.Errorf("QDR: %v %v, want 4000 MB/s (8b/10b)", bw, ok)
	}
	if dev, p, ok := splitDevPort("mlx5_0:1"); !ok || dev != "mlx5_0" || p != 1 {
		t.Errorf("splitDevPort: %q %d %v", dev, p, ok)
	}
	if _, _, ok := splitDevPort("memory"); ok {
		t.Error("splitDevPort accepted a device without port")
	}
}
