package main

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

// TestServeAndGet runs the example in one process: HTTP/1.1 and h2c over rdmanet.
func TestServeAndGet(t *testing.T) {
	lis, err := serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	r, w, _ := os.Pipe()
	stdout := os.Stdout
	os.Stdout = w
	err = get(lis.Addr().String())
	os.Stdout = stdout
	w.Close()
	var buf bytes.Buffer
	io.Copy(&buf, r)
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"hello over self (HTTP/1.1)", "hello over self (HTTP/2.0)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
