package rt

import (
	"encoding/hex"
	"os"
	"strings"
	"sync"

	"github.com/gouct/gouct/internal/wire"
)

var (
	hostOnce sync.Once
	hostID   wire.HostID
)

// LocalHost is this process's host identity: the kernel boot id (all zero
// where the OS has none, which then never matches a peer's... except another
// such host, so host-local transports also check reachability themselves)
// and the uid.
func LocalHost() wire.HostID {
	hostOnce.Do(func() {
		hostID.UID = uint32(os.Getuid())
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			return
		}
		s := strings.ReplaceAll(strings.TrimSpace(string(b)), "-", "")
		if raw, err := hex.DecodeString(s); err == nil && len(raw) == len(hostID.BootID) {
			copy(hostID.BootID[:], raw)
		}
	})
	return hostID
}
