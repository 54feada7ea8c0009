// Package rt is the process-wide runtime shared by dialer/, listener/ and
// rdmanet/: one uct.Worker, the ifaces opened on it (lazily, on first use),
// one stream.Mux per iface, the conn types every Dial and Accept returns, and
// the helpers both sides of the wireup share.
package rt

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/gouct/gouct/uct"
)

// Resolve returns the configuration to use for cfg: nil means the
// environment (RDMANET_* over the defaults); in a non-nil cfg every zero
// field takes its value from the environment (so a zero Config is the
// defaults, and a Config that sets only TLS keeps the rest). cfg is not
// modified; the result is a fresh copy the caller owns.
func Resolve(cfg *uct.Config) (*uct.Config, error) {
	env, err := uct.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		return env, nil
	}
	out := *cfg
	v, e := reflect.ValueOf(&out).Elem(), reflect.ValueOf(env).Elem()
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).IsZero() {
			v.Field(i).Set(e.Field(i))
		}
	}
	if out.HandshakeTimeout <= 0 || out.MaxHandshakes <= 0 {
		return nil, fmt.Errorf("rdmanet: config: handshake timeout and max handshakes must be positive")
	}
	return &out, nil
}

// TCPAllowed reports whether cfg allows the raw TCP fallback.
func TCPAllowed(cfg *uct.Config) bool { return cfg.TLAllowed("tcp", "tcp") }

// TLSString is cfg's transport list as the user wrote it, for errors.
func TLSString(cfg *uct.Config) string {
	if len(cfg.TLS) == 0 {
		return "all"
	}
	return strings.Join(cfg.TLS, ",")
}

// TCPNetwork maps an rdmanet network name to the bootstrap socket's.
func TCPNetwork(network string) (string, error) {
	switch network {
	case "rdma":
		return "tcp", nil
	case "rdma4":
		return "tcp4", nil
	case "rdma6":
		return "tcp6", nil
	}
	return "", fmt.Errorf("%w %q (want rdma, rdma4 or rdma6)", ErrUnknownNetwork, network)
}
