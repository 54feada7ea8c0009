package uct

import (
	"strings"
	"testing"
	"time"
)

func cfgFrom(t *testing.T, env map[string]string) (*Config, error) {
	t.Helper()
	return configFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

func TestConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	if c.RxWindow != 4<<20 || c.ProgressSpin != 100*time.Microsecond || c.IBGIDIndex != -1 ||
		len(c.TLS) != 1 || c.TLS[0] != "all" || c.HandshakeTimeout != 10*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	for _, f := range c.Fields() {
		if !strings.HasPrefix(f.Env, "RDMANET_") || f.Doc == "" || f.Default == "" {
			t.Errorf("field %s: env %q doc %q default %q", f.Field, f.Env, f.Doc, f.Default)
		}
	}
}

func TestConfigEnv(t *testing.T) {
	c, err := cfgFrom(t, map[string]string{"RDMANET_TLS": " shm, rc ", "RDMANET_RX_WINDOW": "256K",
		"RDMANET_PROGRESS_SPIN": "1ms", "RDMANET_NET_DEVICES": "rxe0:1"})
	if err != nil {
		t.Fatal(err)
	}
	if c.RxWindow != 256<<10 || c.ProgressSpin != time.Millisecond {
		t.Fatalf("%+v", c)
	}
	for _, tc := range []struct {
		comp, tl string
		want     bool
	}{{"shm", "shm", true}, {"ib", "rc_verbs", true}, {"tcp", "tcp", false}, {"self", "self", false}} {
		if got := c.TLAllowed(tc.comp, tc.tl); got != tc.want {
			t.Errorf("TLAllowed(%s,%s)=%v", tc.comp, tc.tl, got)
		}
	}
	if !c.TLSForced() {
		t.Error("explicit list not reported as forced")
	}
	if !c.DeviceAllowed("rxe0", 1) || c.DeviceAllowed("rxe0", 2) || c.DeviceAllowed("mlx5_0", 1) {
		t.Error("DeviceAllowed")
	}
}

func TestConfigNegation(t *testing.T) {
	c, err := cfgFrom(t, map[string]string{"RDMANET_TLS": "^tcp,self"})
	if err != nil {
		t.Fatal(err)
	}
	if c.TLAllowed("tcp", "tcp") || c.TLAllowed("self", "self") || !c.TLAllowed("shm", "shm") || c.TLSForced() {
		t.Fatal("negation")
	}
	if !DefaultConfig().TLAllowed("ib", "rc_verbs") || DefaultConfig().TLSForced() {
		t.Fatal("all")
	}
}

func TestConfigErrors(t *testing.T) {
	for k, v := range map[string]string{"RDMANET_RX_WINDOW": "lots", "RDMANET_PROGRESS_SPIN": "-1s",
		"RDMANET_HANDSHAKE_TIMEOUT": "10"} {
		_, err := cfgFrom(t, map[string]string{k: v})
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: err %v, want one naming the variable", k, v, err)
		}
	}
}

func TestParseSize(t *testing.T) {
	for s, want := range map[string]int64{"0": 0, "17": 17, "8K": 8192, "8k": 8192, "4M": 4 << 20, "1G": 1 << 30, "2KB": 2048} {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("ParseSize(%q)=%d,%v want %d", s, got, err, want)
		}
	}
}
