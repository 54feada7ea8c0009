package main

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"sort"
)

// writeSVG draws two panels, latency (p50, else avg) and bandwidth against
// message size, both on log scales, one line per test and transport. It is
// plain SVG 1.1 written by hand: no plotting dependency.
func writeSVG(w io.Writer, rs []Result) error {
	type point struct{ x, lat, bw float64 }
	type series struct {
		name string
		lat  bool // a *_lat test (or its baseline)
		pts  []point
	}
	byName := map[string]*series{}
	var order []string
	for _, r := range rs {
		if r.Skipped {
			continue
		}
		name := r.Test + " " + r.Transport
		s := byName[name]
		if s == nil {
			s = &series{name: name, lat: isLat(r.Test)}
			byName[name] = s
			order = append(order, name)
		}
		lat := r.LatP50
		if lat == 0 {
			lat = r.LatAvg
		}
		x := float64(max(r.Size, 1))
		if slices.ContainsFunc(s.pts, func(p point) bool { return p.x == x }) {
			continue // a baseline shared by several tests: draw it once
		}
		s.pts = append(s.pts, point{x: x, lat: lat, bw: r.BW})
	}
	bw := bufio.NewWriter(w)
	const W, panelW, top, left, plotW, plotH = 1000, 500, 40, 70, 400, 300
	H := top + plotH + 60 + (len(order)+2)/3*18 + 10
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	if len(order) == 0 {
		fmt.Fprintf(bw, `<text x="20" y="30">no results</text></svg>`+"\n")
		return bw.Flush()
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for _, s := range byName {
		sort.Slice(s.pts, func(i, j int) bool { return s.pts[i].x < s.pts[j].x })
		for _, p := range s.pts {
			xmin, xmax = math.Min(xmin, p.x), math.Max(xmax, p.x)
		}
	}
	lx0, lx1 := math.Log2(xmin), math.Log2(xmax)
	if lx1-lx0 < 1 {
		lx0, lx1 = lx0-0.5, lx1+0.5
	}
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}
	// Latency is drawn for the *_lat tests and bandwidth for the *_bw
	// tests; a run of only one kind draws it in both panels.
	var nLat int
	for _, s := range byName {
		if s.lat {
			nLat++
		}
	}
	inPanel := func(panel int, s *series) bool {
		if nLat == 0 || nLat == len(byName) {
			return true
		}
		return s.lat == (panel == 0)
	}
	for panel, title := range []string{"latency (µs, p50 or avg)", "bandwidth (MB/s)"} {
		val := func(p point) float64 {
			if panel == 0 {
				return p.lat
			}
			return p.bw
		}
		ymin, ymax := math.Inf(1), math.Inf(-1)
		for _, s := range byName {
			if !inPanel(panel, s) {
				continue
			}
			for _, p := range s.pts {
				if v := val(p); v > 0 {
					ymin, ymax = math.Min(ymin, v), math.Max(ymax, v)
				}
			}
		}
		if math.IsInf(ymin, 1) {
			ymin, ymax = 1, 10
		}
		ly0, ly1 := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
		if ly1 <= ly0 {
			ly1 = ly0 + 1
		}
		ox := panel*panelW + left
		X := func(x float64) float64 { return float64(ox) + (math.Log2(x)-lx0)/(lx1-lx0)*plotW }
		Y := func(y float64) float64 { return float64(top+plotH) - (math.Log10(y)-ly0)/(ly1-ly0)*plotH }
		fmt.Fprintf(bw, `<text x="%d" y="%d" font-size="14" text-anchor="middle">%s vs message size</text>`+"\n", ox+plotW/2, top-14, title)
		fmt.Fprintf(bw, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", ox, top, plotW, plotH)
		for e := ly0; e <= ly1; e++ {
			y := Y(math.Pow(10, e))
			fmt.Fprintf(bw, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", ox, y, ox+plotW, y)
			fmt.Fprintf(bw, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", ox-6, y+4, decade(e))
		}
		step := math.Max(1, math.Ceil((math.Floor(lx1)-math.Ceil(lx0))/8))
		ticks := []float64{}
		for e := math.Ceil(lx0); e <= lx1; e += step {
			ticks = append(ticks, e)
		}
		if last := math.Floor(lx1); len(ticks) > 0 && last-ticks[len(ticks)-1] >= step/2 {
			ticks = append(ticks, last) // label the largest size too
		}
		for _, e := range ticks {
			x := X(math.Pow(2, e))
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, top+plotH)
			fmt.Fprintf(bw, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, top+plotH+16, sizeStr(int(math.Pow(2, e))))
		}
		fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="middle">message size (bytes)</text>`+"\n", ox+plotW/2, top+plotH+34)
		for i, name := range order {
			s := byName[name]
			if !inPanel(panel, s) {
				continue
			}
			col := colors[i%len(colors)]
			path := ""
			for _, p := range s.pts {
				if v := val(p); v > 0 {
					cmd := "L"
					if path == "" {
						cmd = "M"
					}
					path += fmt.Sprintf("%s%.1f,%.1f ", cmd, X(p.x), Y(v))
					fmt.Fprintf(bw, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", X(p.x), Y(v), col)
				}
			}
			if path != "" {
				fmt.Fprintf(bw, `<path d="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", path, col)
			}
		}
	}
	for i, name := range order {
		x, y := left+(i%3)*300, top+plotH+60+(i/3)*18
		col := colors[i%len(colors)]
		fmt.Fprintf(bw, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`, x, y-4, x+24, y-4, col)
		fmt.Fprintf(bw, `<text x="%d" y="%d">%s</text>`+"\n", x+30, y, html.EscapeString(name))
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

// decade labels 10^e compactly: 0.01, 0.1, 1, 10, 100, 1k, 10k …
func decade(e float64) string {
	v := math.Pow(10, e)
	switch {
	case e >= 6:
		return fmt.Sprintf("%gM", v/1e6)
	case e >= 3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}
