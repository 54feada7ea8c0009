package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/gouct/gouct/cmd/internal/cliutil"
	_ "github.com/gouct/gouct/cmd/internal/transports"
	"github.com/gouct/gouct/uct"
)

// Report is the -json output. Sections not asked for are omitted.
type Report struct {
	Build      *cliutil.BuildInfo `json:"build,omitempty"`
	Components []ComponentReport  `json:"components,omitempty"`
	Config     []ConfigVar        `json:"config,omitempty"`
}

// ComponentReport is one registered component, available or not.
type ComponentReport struct {
	Name      string     `json:"name"`
	Available bool       `json:"available"`
	Reason    string     `json:"reason,omitempty"` // why it is unavailable
	MDs       []MDReport `json:"mds"`
}

// MDReport is one memory-domain resource of a component.
type MDReport struct {
	Name       string            `json:"name"`
	Error      string            `json:"error,omitempty"` // open failed
	Attr       *cliutil.MDInfo   `json:"attr,omitempty"`
	Transports []TransportReport `json:"transports"`
}

// TransportReport is one TL resource and the attributes of the iface opened on it.
type TransportReport struct {
	Name    string             `json:"name"` // tl/device
	TL      string             `json:"tl"`
	Device  string             `json:"device"`
	Type    string             `json:"device_type"`
	Allowed bool               `json:"allowed"` // by RDMANET_TLS
	Error   string             `json:"error,omitempty"`
	Iface   *cliutil.IfaceInfo `json:"iface,omitempty"`
	// Device holds what the transport tells about its device beyond the
	// uct attributes (IB ports: link layer, state, MTU, speed, GIDs…).
	DeviceInfo map[string]any `json:"device_info,omitempty"`
}

// ConfigVar is one RDMANET_* variable; Doc and Default only with -f.
type ConfigVar struct {
	Env     string `json:"env"`
	Value   string `json:"value"`
	Field   string `json:"field"`
	Default string `json:"default,omitempty"`
	Doc     string `json:"doc,omitempty"`
}

type command struct {
	stdout, stderr io.Writer
	fs             *flag.FlagSet
	devices        bool
	config         bool
	full           bool
	version        bool
	json           bool
}

func newCommand(stdout, stderr io.Writer) *command {
	c := &command{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("rdmanet-info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&c.devices, "d", false, "show components, memory domains, transports and iface attributes")
	fs.BoolVar(&c.config, "c", false, "show the effective configuration (every RDMANET_* variable)")
	fs.BoolVar(&c.full, "f", false, "show the configuration with each variable's documentation")
	fs.BoolVar(&c.version, "v", false, "show version and build information")
	fs.BoolVar(&c.json, "json", false, "print one JSON object instead of text")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rdmanet-info [-d] [-c] [-f] [-v] [-json]\n\n"+
			"Shows what gouct sees on this host (like ucx_info). Without a section flag: -v -d.\n\n")
		fs.PrintDefaults()
	}
	c.fs = fs
	return c
}

func (c *command) main(args []string) int {
	if err := c.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if c.fs.NArg() > 0 {
		fmt.Fprintf(c.stderr, "rdmanet-info: unexpected argument %q\n", c.fs.Arg(0))
		c.fs.Usage()
		return 2
	}
	if !c.devices && !c.config && !c.full && !c.version {
		c.devices, c.version = true, true
	}
	rep, err := c.collect()
	if err != nil {
		fmt.Fprintln(c.stderr, "rdmanet-info:", err)
		return 1
	}
	if c.json {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(c.stderr, "rdmanet-info:", err)
			return 1
		}
		return 0
	}
	c.printText(rep)
	return 0
}

func (c *command) collect() (*Report, error) {
	cfg, err := uct.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	rep := &Report{}
	if c.version {
		b := cliutil.ReadBuildInfo()
		rep.Build = &b
	}
	if c.devices {
		rep.Components = collectDevices(cfg)
	}
	if c.config || c.full {
		for _, f := range cfg.Fields() {
			v := ConfigVar{Env: f.Env, Value: f.Value, Field: f.Field}
			if c.full {
				v.Default, v.Doc = f.Default, f.Doc
			}
			rep.Config = append(rep.Config, v)
		}
	}
	return rep, nil
}

// collectDevices walks every registered component like the seed's resource
// query: component → MD resources → open MD → TL resources → open iface →
// attributes. Every iface and MD opened here is closed before it returns.
func collectDevices(cfg *uct.Config) []ComponentReport {
	w := uct.NewWorker(cfg)
	defer w.Close()
	var out []ComponentReport
	for _, ci := range uct.Components() {
		name := ci.Component.Name()
		cr := ComponentReport{Name: name, Available: ci.Err == nil, MDs: []MDReport{}}
		if ci.Err != nil {
			cr.Reason = reason(ci.Err)
		}
		for _, mr := range ci.Resources {
			cr.MDs = append(cr.MDs, collectMD(w, cfg, ci.Component, mr))
		}
		out = append(out, cr)
	}
	return out
}

func collectMD(w *uct.Worker, cfg *uct.Config, comp uct.Component, mr uct.MDResource) MDReport {
	r := MDReport{Name: mr.Name, Transports: []TransportReport{}}
	md, err := comp.OpenMD(mr.Name, cfg)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer md.Close()
	a := cliutil.DescribeMD(md)
	r.Attr = &a
	tls, err := md.TLResources()
	if err != nil {
		r.Error = err.Error()
	}
	for _, tl := range tls {
		tr := TransportReport{Name: tl.Name(), TL: tl.TL, Device: tl.Device, Type: tl.Type.String(),
			Allowed: cfg.TLAllowed(comp.Name(), tl.TL)}
		ifc, err := md.OpenIface(w, tl, uct.IfaceParams{Config: cfg})
		if err != nil {
			tr.Error = err.Error()
		} else {
			t := &uct.TLIface{Component: comp.Name(), MD: md, Resource: tl, Iface: ifc, Attr: ifc.Attr()}
			d := cliutil.DescribeIface(t)
			tr.Iface = &d
			tr.DeviceInfo = deviceInfo(md, tl, ifc)
			if err := ifc.Close(); err != nil && tr.Error == "" {
				tr.Error = "close: " + err.Error()
			}
		}
		r.Transports = append(r.Transports, tr)
	}
	return r
}

// reason drops the ErrUnavailable text to keep the "why" ("libibverbs not found").
func reason(err error) string {
	s := strings.Replace(err.Error(), uct.ErrUnavailable.Error()+": ", "", 1)
	return strings.TrimSpace(s)
}
