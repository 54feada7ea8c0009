package main

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// progressBar redraws one line on a terminal's stderr five times a second
// from a counter the test loops store into; stdout is left alone.
type progressBar struct {
	done  atomic.Int64
	total int64
	f     *os.File
	quit  chan struct{}
	ended chan struct{}
}

func startProgress(f *os.File, total int64) *progressBar {
	p := &progressBar{total: max(total, 1), f: f, quit: make(chan struct{}), ended: make(chan struct{})}
	go p.loop()
	return p
}

func (p *progressBar) loop() {
	defer close(p.ended)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	p.draw(0)
	for {
		select {
		case <-p.quit:
			fmt.Fprint(p.f, "\r\033[K")
			return
		case <-t.C:
			p.draw(time.Since(start))
		}
	}
}

func (p *progressBar) draw(elapsed time.Duration) {
	const width = 40
	d := min(p.done.Load(), p.total)
	frac := float64(d) / float64(p.total)
	n := int(frac * width)
	fmt.Fprintf(p.f, "\r[%s%s] %3.0f%% %s", strings.Repeat("=", n), strings.Repeat(" ", width-n),
		frac*100, elapsed.Round(time.Second))
}

func (p *progressBar) stop() {
	close(p.quit)
	<-p.ended
}
