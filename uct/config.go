package uct

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Config is the library configuration. Each field is read from the
// environment variable in its `env` tag (UCX-style: environment first), with
// the default in `default`; `doc` is its one documentation string, printed by
// rdmanet-info -f. Sizes accept K/M/G suffixes; durations use Go syntax.
type Config struct {
	TLS              []string      `env:"RDMANET_TLS" default:"all" doc:"Transports to use, comma separated (rc_verbs, shm, self, tcp; or component names ib, shm, self, tcp). 'all' allows every one; a leading '^' negates the list (e.g. '^tcp'). With a forced list and nothing common, Dial fails instead of using something else."`
	NetDevices       []string      `env:"RDMANET_NET_DEVICES" default:"all" doc:"Network devices to use for RDMA, comma separated, as device or device:port (e.g. mlx5_0:1, rxe0). 'all' uses every active port."`
	RndvThresh       int           `env:"RDMANET_RNDV_THRESH" default:"0" doc:"Write size in bytes from which the stream uses rendezvous (zero copy: the reader pulls from the writer's buffer). 0 derives it from the transport's registration cost and bandwidth."`
	RxWindow         int           `env:"RDMANET_RX_WINDOW" default:"4M" doc:"Receive window per connection in bytes: how much a writer may send before the reader consumes it (credits). Bounds buffering on both sides."`
	ProgressSpin     time.Duration `env:"RDMANET_PROGRESS_SPIN" default:"100us" doc:"How long the worker's progress goroutine keeps polling after the last event before it arms event fds and parks. Must exceed the wake-up cost to keep latency low; 0 parks at once."`
	ReadSpin         time.Duration `env:"RDMANET_READ_SPIN" default:"50us" doc:"How long a blocked Read or Write polls the transport itself before parking (fastest path for ping-pong traffic). 0 disables it."`
	SpinPressure     int           `env:"RDMANET_SPIN_PRESSURE" default:"0" doc:"Opt-in for hosts that other work oversubscribes: CPU pressure, in percent of time runnable tasks waited for a CPU (Linux /proc/pressure/cpu, sampled every 20 ms), above which, while most Read spins also end without their data, nothing polls: the worker and blocked Reads park at once and wait for the transports' events, like blocking sockets. Polling resumes below half of it. A busy application raises the pressure by itself, so keep it off (0, always poll) unless other processes load the host; 10 is a reasonable value then."`
	HandshakeTimeout time.Duration `env:"RDMANET_HANDSHAKE_TIMEOUT" default:"10s" doc:"Deadline for a connection's wireup handshake (hello, transport choice, endpoint connect)."`
	MaxHandshakes    int           `env:"RDMANET_MAX_HANDSHAKES" default:"128" doc:"Handshakes a listener runs at once; more clients wait in the kernel's accept queue."`
	ShmFifoSize      int           `env:"RDMANET_SHM_FIFO_SIZE" default:"256" doc:"Elements in each shared-memory iface's receive FIFO (power of two)."`
	ShmSegSize       int           `env:"RDMANET_SHM_SEG_SIZE" default:"8K" doc:"Size in bytes of a shared-memory FIFO element: the largest AMBcopy."`
	IBTxQueueLen     int           `env:"RDMANET_IB_TX_QUEUE_LEN" default:"256" doc:"Send queue length of each RC QP."`
	IBRxQueueLen     int           `env:"RDMANET_IB_RX_QUEUE_LEN" default:"1024" doc:"Receive buffers pre-posted on each iface's shared receive queue (SRQ)."`
	IBSegSize        int           `env:"RDMANET_IB_SEG_SIZE" default:"8K" doc:"Size in bytes of RDMA bounce and receive buffers: the largest AMBcopy over verbs."`
	IBGIDIndex       int           `env:"RDMANET_IB_GID_INDEX" default:"-1" doc:"RoCE GID index to use; -1 picks the RoCE v2 GID matching the bootstrap connection's IP."`
	LogLevel         string        `env:"RDMANET_LOG_LEVEL" default:"warn" doc:"Log level for the library's slog output: debug, info, warn, error."`
}

// ConfigField describes one configuration variable.
type ConfigField struct {
	Env     string // environment variable
	Field   string // Go field name in Config
	Default string
	Doc     string
	Value   string // current value, formatted
}

// DefaultConfig returns the defaults, ignoring the environment.
func DefaultConfig() *Config {
	c, err := configFrom(func(string) (string, bool) { return "", false })
	if err != nil {
		panic(err) // defaults are constants
	}
	return c
}

// ConfigFromEnv returns the defaults overridden by RDMANET_* variables.
// A malformed value is an error naming the variable.
func ConfigFromEnv() (*Config, error) { return configFrom(os.LookupEnv) }

func configFrom(lookup func(string) (string, bool)) (*Config, error) {
	c := &Config{}
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		s := f.Tag.Get("default")
		if e, ok := lookup(f.Tag.Get("env")); ok {
			s = e
		}
		if err := setField(v.Field(i), s); err != nil {
			return nil, fmt.Errorf("uct: %s=%q: %w", f.Tag.Get("env"), s, err)
		}
	}
	return c, nil
}

func setField(v reflect.Value, s string) error {
	s = strings.TrimSpace(s)
	switch v.Interface().(type) {
	case []string:
		var out []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		v.Set(reflect.ValueOf(out))
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		if d < 0 {
			return fmt.Errorf("negative duration")
		}
		v.SetInt(int64(d))
	case int:
		n, err := ParseSize(s)
		if err != nil {
			return err
		}
		v.SetInt(n)
	case string:
		v.SetString(s)
	default:
		return fmt.Errorf("unsupported config type %s", v.Type())
	}
	return nil
}

// ParseSize parses an integer with an optional K, M or G suffix (powers of 1024).
func ParseSize(s string) (int64, error) {
	mult := int64(1)
	u := strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(s, "B"), "b"))
	switch {
	case strings.HasSuffix(u, "K"):
		mult, u = 1<<10, u[:len(u)-1]
	case strings.HasSuffix(u, "M"):
		mult, u = 1<<20, u[:len(u)-1]
	case strings.HasSuffix(u, "G"):
		mult, u = 1<<30, u[:len(u)-1]
	}
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a size: %q", s)
	}
	return n * mult, nil
}

// Fields lists every configuration variable with its documentation and the
// value it has in c.
func (c *Config) Fields() []ConfigField {
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	out := make([]ConfigField, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		var val string
		switch x := v.Field(i).Interface().(type) {
		case []string:
			val = strings.Join(x, ",")
		default:
			val = fmt.Sprint(x)
		}
		out = append(out, ConfigField{Env: f.Tag.Get("env"), Field: f.Name,
			Default: f.Tag.Get("default"), Doc: f.Tag.Get("doc"), Value: val})
	}
	return out
}

// TLAllowed reports whether transport tl of component comp is allowed by RDMANET_TLS.
func (c *Config) TLAllowed(comp, tl string) bool {
	return listAllows(c.TLS, func(item string) bool {
		return item == tl || item == comp || (item == "rc" && tl == "rc_verbs")
	})
}

// TLSForced reports whether RDMANET_TLS names an explicit positive list.
func (c *Config) TLSForced() bool {
	return len(c.TLS) > 0 && !(len(c.TLS) == 1 && c.TLS[0] == "all") && !strings.HasPrefix(c.TLS[0], "^")
}

// DeviceAllowed reports whether RDMA device dev (port port) is allowed by RDMANET_NET_DEVICES.
func (c *Config) DeviceAllowed(dev string, port int) bool {
	full := fmt.Sprintf("%s:%d", dev, port)
	return listAllows(c.NetDevices, func(item string) bool { return item == dev || item == full })
}

func listAllows(list []string, match func(string) bool) bool {
	if len(list) == 0 {
		return true
	}
	neg := strings.HasPrefix(list[0], "^")
	for i, item := range list {
		if i == 0 && neg {
			item = item[1:]
		}
		if item == "all" && !neg {
			return true
		}
		if match(item) {
			return !neg
		}
	}
	return neg
}
