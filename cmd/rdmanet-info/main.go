// Command rdmanet-info shows what the gouct library sees on this host, as
// ucx_info does for UCX: every transport component with its memory domains
// and interfaces (available or not, and why), the effective RDMANET_*
// configuration, and how the binary was built.
//
//	rdmanet-info -d        components, memory domains, transports and their attributes
//	rdmanet-info -c        effective configuration (every RDMANET_* variable)
//	rdmanet-info -f        the same with each variable's documentation
//	rdmanet-info -v        version and build (cgo, tags, verbs compiled in or not)
//	rdmanet-info -json …   any of the above as one JSON object, for scripts
//
// Without a section flag it prints -v and -d. Exit status: 0 on success, 1
// on an error (such as a malformed RDMANET_* value), 2 on a usage error.
package main

import (
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command, for tests: args without the program name.
func run(args []string, stdout, stderr io.Writer) int {
	return newCommand(stdout, stderr).main(args)
}
