//go:build !linux

package main

var sysfsRoot = ""

// ibPortInfo: RDMA port details come from Linux sysfs only.
func ibPortInfo(root, dev string, port int) map[string]any { return nil }
