package main

import (
	"strconv"
	"strings"

	"github.com/gouct/gouct/uct"
)

// deviceInfo returns what the host tells about the device of an opened TL
// resource beyond IfaceAttr; nil when there is nothing. uct/ib exports no
// port query, so RDMA ports are described from sysfs (the same files
// ibv_devinfo's kernel side fills): see ibPortInfo.
func deviceInfo(md uct.MD, tl uct.TLResource, ifc uct.Iface) map[string]any {
	if tl.TL != "rc_verbs" {
		return nil
	}
	dev, port, ok := splitDevPort(tl.Device)
	if !ok {
		return nil
	}
	return ibPortInfo(sysfsRoot, dev, port)
}

// splitDevPort splits "mlx5_0:1".
func splitDevPort(s string) (string, int, bool) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(s[i+1:])
	if err != nil || p <= 0 {
		return "", 0, false
	}
	return s[:i], p, true
}
