package uct

import "testing"

type rankIface struct {
	Iface
	reach bool
}

func (r rankIface) IsReachable(_, _ []byte) bool { return r.reach }

func TestRankAndSelect(t *testing.T) {
	mk := func(tl string, lat, bw float64, reach bool) *TLIface {
		return &TLIface{Resource: TLResource{TL: tl, Device: "d"}, Iface: rankIface{reach: reach},
			Attr: IfaceAttr{Latency: LinearFunc{C: lat}, Bandwidth: Bandwidth{Dedicated: bw}}}
	}
	fastSmall := mk("a", 1e-6, 1e9, true)  // 1 µs + 1 ns/B
	fastLarge := mk("b", 5e-6, 20e9, true) // 5 µs + 0.05 ns/B
	unreach := mk("c", 0, 100e9, false)
	ts := []*TLIface{fastLarge, unreach, fastSmall}
	Rank(ts, 8)
	if ts[0] != unreach || ts[1] != fastSmall {
		t.Fatalf("rank 8 B: %s %s", ts[0].Resource.TL, ts[1].Resource.TL)
	}
	Rank(ts, 1<<20)
	if ts[1] != fastLarge {
		t.Fatalf("rank 1 MiB: %s", ts[1].Resource.TL)
	}
	peer := []TLAddress{{TL: "a"}, {TL: "b"}, {TL: "c"}}
	got, pa, err := Select(ts, peer, 8)
	if err != nil || got != fastSmall || pa.TL != "a" {
		t.Fatalf("select: %v %v", got, err)
	}
	if _, _, err := Select(ts, []TLAddress{{TL: "c"}, {TL: "zz"}}, 8); err != ErrUnreachable {
		t.Fatalf("want ErrUnreachable, got %v", err)
	}
}
