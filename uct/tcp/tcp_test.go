package tcp_test

import (
	"testing"

	"github.com/gouct/gouct/uct/uctest"

	_ "github.com/gouct/gouct/uct/tcp"
)

func TestSuite(t *testing.T) { uctest.RunOptions(t, uctest.Options{TL: "tcp", Device: "lo"}) }

func BenchmarkPingPong8(b *testing.B)   { uctest.BenchPingPongOptions(b, lo, 8) }
func BenchmarkPingPong4K(b *testing.B)  { uctest.BenchPingPongOptions(b, lo, 4096) }
func BenchmarkBandwidth8K(b *testing.B) { uctest.BenchBandwidthOptions(b, lo, 8192) }
func BenchmarkBandwidth1M(b *testing.B) { uctest.BenchBandwidthOptions(b, lo, 1<<20) }

var lo = uctest.Options{TL: "tcp", Device: "lo"}
