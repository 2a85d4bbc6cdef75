package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Default is the config used when no file is given: an HTTP listener on
// 127.0.0.1:10000 that answers every request itself, and the admin API on
// DefaultAdminAddress.
//
//go:embed default.toml
var Default []byte

// DefaultSource is the Source of the embedded default config.
const DefaultSource = "<embedded default>"

// Load reads, parses and validates the config file at path; path "" loads
// the embedded Default. Errors that concern the config match ErrInvalid.
func Load(path string) (*Config, error) {
	if path == "" {
		return Parse(Default, DefaultSource)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(data, path)
}

// Parse decodes data strictly (unknown keys and values of the wrong type
// are errors), fills in defaults and validates the result. source names
// the data in errors and becomes Config.Source. The error, if any, is an
// *Error that lists every problem found.
func Parse(data []byte, source string) (*Config, error) {
	// First pass: into generic maps, to find syntax errors, and, against
	// the schema, unknown keys and wrong types, all of them, with indices.
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return nil, syntaxError(source, data, err)
	}
	ch := checker{homes: homesOf(rootSchema(), nil)}
	ch.check(rootSchema(), raw, "")
	ps := ch.problems
	if ch.badType {
		ps.locate(data)
		return nil, ps.err(source)
	}

	// Second pass: into the types.
	var c Config
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		// The first pass should have caught it; report what the decoder says.
		ps.add("", "%s", strings.TrimPrefix(err.Error(), "toml: "))
		return nil, ps.err(source)
	}
	if len(ps) == 0 {
		for _, k := range md.Undecoded() {
			ps.add("", "unknown key %q", k.String())
		}
	}
	c.Source = source
	c.normalize()
	c.resolveFiles(source)
	c.setDefaults(raw, true)
	shape := len(ps) // problems of the file's shape (unknown keys) lead
	if err := c.Validate(); err != nil {
		var e *Error
		if errors.As(err, &e) {
			ps = append(ps, e.Problems...)
		} else {
			ps.add("", "%v", err)
		}
	}
	if len(ps) > 0 {
		ps.locate(data)
		ps[shape:].sortByLine()
		return nil, ps.err(source)
	}
	return &c, nil
}

func syntaxError(source string, data []byte, err error) error {
	var pe toml.ParseError
	if !errors.As(err, &pe) {
		return &Error{Source: source, Problems: []Problem{{Msg: strings.TrimPrefix(err.Error(), "toml: ")}}}
	}
	p := Problem{
		Line:   pe.Position.Line,
		Column: pe.Position.Col,
		Msg:    "syntax error: " + pe.Message,
	}
	p.Context = errorContext(pe, data)
	return &Error{Source: source, Problems: []Problem{p}}
}

// errorContext returns the lines of data around a syntax error, from
// ErrorWithPosition, or "" when the position is unusable.
func errorContext(pe toml.ParseError, data []byte) (ctx string) {
	// toml v1.6.0's ErrorWithPosition indexes out of range when the
	// position is off the input (Line 0 for `"\` at the end of a file):
	// check the position, and recover in case of another such bug, so that
	// a bad file gets an error message and never crashes the process.
	pos := pe.Position
	if pos.Line < 1 || pos.Line > bytes.Count(data, []byte("\n"))+1 || pos.Col < 1 || pos.Len < 0 {
		return ""
	}
	defer func() {
		if recover() != nil {
			ctx = ""
		}
	}()
	// ErrorWithPosition is "toml: error: MSG\n\nAt line L, column C:\n\n"
	// and then the lines around the error; keep those lines.
	full := pe.ErrorWithPosition()
	if i := strings.Index(full, "\n\nAt line "); i >= 0 {
		if _, c, ok := strings.Cut(full[i:], ":\n\n"); ok {
			return c
		}
	}
	return ""
}

// normalize makes empty lists nil, so that equal configs are deeply equal
// however they were written.
func (c *Config) normalize() {
	if len(c.Listeners) == 0 {
		c.Listeners = nil
	}
	if len(c.Clusters) == 0 {
		c.Clusters = nil
	}
	for i := range c.Listeners {
		if len(c.Listeners[i].Routes) == 0 {
			c.Listeners[i].Routes = nil
		}
	}
	for i := range c.Clusters {
		if len(c.Clusters[i].Endpoints) == 0 {
			c.Clusters[i].Endpoints = nil
		}
		if hc := c.Clusters[i].HealthCheck; hc != nil && len(hc.ExpectedStatuses) == 0 {
			hc.ExpectedStatuses = nil
		}
	}
}

// SetDefaults fills in the default of every key left out, for configs
// built in code: a key is left out when its value is the zero value (nil,
// for the pointers of keys whose 0 means something of its own). Parse does
// this itself, from what the file says.
func (c *Config) SetDefaults() { c.setDefaults(nil, false) }

// setDefaults fills in the defaults declared on the fields (declare.go);
// fromFile: for the keys raw, the generic decoding of the file, does not
// have.
func (c *Config) setDefaults(raw map[string]any, fromFile bool) {
	applyDefaults(reflect.ValueOf(c).Elem(), rootSchema(), raw, fromFile, nil)
}

// defaultParentShutdown is DefaultParentShutdownTime, or one and a half
// times drain when that is longer, so that raising drain_time alone does
// not make the config invalid. It stays within the bounds of
// parent_shutdown_time, so that a drain_time out of range is the one
// problem reported, not two.
func defaultParentShutdown(drain Duration) Duration {
	p := Duration(DefaultParentShutdownTime)
	if drain > p {
		p = drain + min(drain/2, math.MaxInt64-drain)
	}
	_, hi := boundOf("server.parent_shutdown_time")
	return min(p, Duration(hi))
}

// durationString is d as written back: "1m30s".
func durationString(d Duration) string { return time.Duration(d).String() }
