//go:build linux

package shm_test

import (
	"testing"

	_ "github.com/gouct/gouct/uct/shm"
	"github.com/gouct/gouct/uct/uctest"
)

func TestSuite(t *testing.T) { uctest.Run(t, "shm") }
