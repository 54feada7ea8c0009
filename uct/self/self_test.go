package self_test

import (
	"testing"

	"github.com/gouct/gouct/uct/uctest"

	_ "github.com/gouct/gouct/uct/self"
)

func TestSuite(t *testing.T) { uctest.Run(t, "self") }

func BenchmarkPingPong8(b *testing.B)   { uctest.BenchPingPong(b, "self", 8) }
func BenchmarkPingPong4K(b *testing.B)  { uctest.BenchPingPong(b, "self", 4096) }
func BenchmarkBandwidth8K(b *testing.B) { uctest.BenchBandwidth(b, "self", 8192) }
func BenchmarkBandwidth1M(b *testing.B) { uctest.BenchBandwidth(b, "self", 1<<20) }
