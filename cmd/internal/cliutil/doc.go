// Package cliutil holds what rdmanet-info and rdmanet-perf share: build
// information, profiling flags, terminal detection, and a stable, JSON-able
// description of opened transport interfaces.
package cliutil
