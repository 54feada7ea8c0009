package main

import "github.com/gouct/gouct/uct"

// deviceInfo returns what a transport exposes about its device beyond
// IfaceAttr, through optional interfaces of its exported API; nil when it
// offers nothing.
func deviceInfo(md uct.MD, tl uct.TLResource, ifc uct.Iface) map[string]any {
	return nil
}
