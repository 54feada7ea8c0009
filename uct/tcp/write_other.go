//go:build !unix

package tcp

// doWrite: without writev, every batch goes through the writer goroutine.
func (e *ep) doWrite(fd uintptr) bool { return true }
