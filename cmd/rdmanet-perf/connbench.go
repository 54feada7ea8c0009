package main

import (
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// Conn-level networks: "rdma" is gouct's Conn (rdmanet.Listen / Dial, the
// transport negotiated per connection), "tcp" is Go's net package, the
// baseline of -compare tcp.
const (
	netRDMA = "rdma"
	netTCP  = "tcp"
)

// connSide is one data connection of a Conn-level session and its buffer.
type connSide struct {
	c        net.Conn
	buf      []byte
	rbuf     []byte // server's bw read buffer
	ack      [1]byte
	progress *atomic.Int64
	progBase int64
}

func (s *connSide) prepare(size int) {
	if len(s.buf) < size {
		s.buf = make([]byte, size)
		for i := range s.buf {
			s.buf[i] = byte(i)
		}
	}
}

// abort makes a blocked Read or Write return (a deadline in the past).
func (s *connSide) abort() { s.c.SetDeadline(time.Unix(1, 0)) }

func (s *connSide) tick(i int) {
	if s.progress != nil && i&255 == 0 {
		s.progress.Store(s.progBase + int64(i))
	}
}

// clientLat writes size bytes and reads them back, warmup+len(samples)
// times; samples receive half round trips in ns.
func (s *connSide) clientLat(size, warmup int, samples []int64, deadline time.Time) error {
	s.c.SetDeadline(deadline)
	b := s.buf[:size]
	total := warmup + len(samples)
	for i := 0; i < total; i++ {
		t0 := time.Now()
		if _, err := s.c.Write(b); err != nil {
			return fmt.Errorf("write %d B: %w", size, err)
		}
		if _, err := io.ReadFull(s.c, b); err != nil {
			return fmt.Errorf("read %d B: %w", size, err)
		}
		if i >= warmup {
			samples[i-warmup] = int64(time.Since(t0)) / 2
		}
		s.tick(i)
	}
	return nil
}

// serverLat echoes total messages of size bytes.
func (s *connSide) serverLat(size, total int, deadline time.Time) error {
	s.c.SetDeadline(deadline)
	b := s.buf[:size]
	for i := 0; i < total; i++ {
		if _, err := io.ReadFull(s.c, b); err != nil {
			return fmt.Errorf("read %d B: %w", size, err)
		}
		if _, err := s.c.Write(b); err != nil {
			return fmt.Errorf("write %d B: %w", size, err)
		}
	}
	return nil
}

// clientBW writes warmup writes of size bytes, waits for the ack byte, then
// writes iters more and returns the time until the second ack.
func (s *connSide) clientBW(size, warmup, iters int, deadline time.Time) (time.Duration, error) {
	s.c.SetDeadline(deadline)
	b := s.buf[:size]
	for i := 0; i < warmup; i++ {
		if _, err := s.c.Write(b); err != nil {
			return 0, fmt.Errorf("write %d B: %w", size, err)
		}
	}
	if _, err := io.ReadFull(s.c, s.ack[:]); err != nil {
		return 0, fmt.Errorf("read ack: %w", err)
	}
	t0 := time.Now()
	for i := 0; i < iters; i++ {
		if _, err := s.c.Write(b); err != nil {
			return 0, fmt.Errorf("write %d B: %w", size, err)
		}
		s.tick(warmup + i)
	}
	if _, err := io.ReadFull(s.c, s.ack[:]); err != nil {
		return 0, fmt.Errorf("read ack: %w", err)
	}
	return time.Since(t0), nil
}

// serverBW reads warmup*size bytes, acks, reads iters*size bytes, acks.
func (s *connSide) serverBW(size, warmup, iters int, deadline time.Time) error {
	s.c.SetDeadline(deadline)
	if len(s.rbuf) == 0 {
		s.rbuf = make([]byte, 1<<20)
	}
	for _, n := range []int{warmup, iters} {
		for rem := int64(n) * int64(size); rem > 0; {
			k, err := s.c.Read(s.rbuf[:min(int64(len(s.rbuf)), rem)])
			rem -= int64(k)
			if err != nil && rem > 0 {
				return fmt.Errorf("read (%d B short): %w", rem, err)
			}
		}
		if _, err := s.c.Write(s.ack[:]); err != nil {
			return fmt.Errorf("write ack: %w", err)
		}
	}
	return nil
}
