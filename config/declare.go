package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// A key is declared once, on its field, by struct tags that the schema walk
// (schema.go) reads:
//
//	default:"30s"      the value a key left out gets (parsed as the field's
//	                   type; a list is comma-separated)
//	bound:"100ms..24h" the range the value must be in (integers may name
//	                   one of boundNames)
//	note:"..."         what an out-of-range integer's message adds in
//	                   parentheses; %v there is the default
//	only:"http"        the listener protocols the key applies to: set on a
//	                   listener of another protocol it is refused, and it
//	                   gets no default there
//
// Defaults that depend on other keys cannot be written in a tag; they are
// conditionalDefaults, each in one place. Everything else (applying
// defaults, checking bounds, refusing a key on the wrong protocol, and the
// tests of examples/hotproxy.toml) follows from the tags, so a new key is
// one declaration and its use.

// boundNames are the constants a bound tag may name.
var boundNames = map[string]int{
	"MaxConcurrency":      MaxConcurrency,
	"MaxConnectionsLimit": MaxConnectionsLimit,
}

// parseTags fills in f's declaration from the struct field's tags; it
// panics on a malformed tag, which the tests of this package catch.
func (f *field) parseTags(sf reflect.StructField) {
	bad := func(tag, msg string) {
		panic(fmt.Sprintf("config: field %s (%s): tag %s: %s", sf.Name, f.path, tag, msg))
	}
	if d, ok := sf.Tag.Lookup("default"); ok {
		v, err := parseValue(sf.Type, d)
		if err != nil {
			bad("default", err.Error())
		}
		f.def, f.hasDef = v, true
	}
	if b, ok := sf.Tag.Lookup("bound"); ok {
		lo, hi, found := strings.Cut(b, "..")
		if !found {
			bad("bound", `write it "MIN..MAX"`)
		}
		var err error
		if f.min, err = f.parseBound(lo); err == nil {
			f.max, err = f.parseBound(hi)
		}
		if err != nil {
			bad("bound", err.Error())
		}
		if f.max < f.min {
			bad("bound", "max below min")
		}
		f.hasBound = true
	}
	f.note = sf.Tag.Get("note")
	if o := sf.Tag.Get("only"); o != "" {
		f.only = strings.Split(o, ",")
	}
}

func (f *field) parseBound(s string) (int64, error) {
	switch f.kind {
	case kDuration:
		d, err := time.ParseDuration(s)
		return int64(d), err
	case kInt:
		if n, ok := boundNames[s]; ok {
			return int64(n), nil
		}
		n, err := strconv.Atoi(s)
		return int64(n), err
	}
	return 0, fmt.Errorf("only integers and durations have bounds")
}

// parseValue parses s, a default written in a tag, as a value of type t.
func parseValue(t reflect.Type, s string) (reflect.Value, error) {
	v := reflect.New(t).Elem()
	target := v
	if t.Kind() == reflect.Pointer {
		target = reflect.New(t.Elem()).Elem()
	}
	switch {
	case target.Type() == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return v, err
		}
		target.SetInt(int64(d))
	case target.Kind() == reflect.String:
		target.SetString(s)
	case target.Kind() == reflect.Int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return v, err
		}
		target.SetInt(int64(n))
	case target.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return v, err
		}
		target.SetBool(b)
	case target.Kind() == reflect.Slice && target.Type().Elem().Kind() == reflect.String:
		target.Set(reflect.ValueOf(strings.Split(s, ",")))
	case target.Kind() == reflect.Slice && target.Type().Elem().Kind() == reflect.Int:
		var ns []int
		for _, e := range strings.Split(s, ",") {
			n, err := strconv.Atoi(e)
			if err != nil {
				return v, err
			}
			ns = append(ns, n)
		}
		target.Set(reflect.ValueOf(ns))
	default:
		return v, fmt.Errorf("type %s cannot have a default", t)
	}
	if t.Kind() == reflect.Pointer {
		v.Set(target.Addr())
	}
	return v, nil
}

// A conditionalDefault computes the default of a key from the tables that
// enclose it (outermost first, the key's own table last). apply false: the
// key gets no default there, and the value, if any, is only what a bound's
// message offers as "the default".
type conditionalDefault func(tables []reflect.Value) (v any, apply bool)

// conditionalDefaults are the defaults that depend on other keys, by the
// key's path in the schema.
var conditionalDefaults = map[string]conditionalDefault{
	// A TCP session may sit idle far longer than a keep-alive connection.
	"listeners.idle_timeout": func(ts []reflect.Value) (any, bool) {
		switch ts[len(ts)-1].Interface().(Listener).Protocol {
		case ProtocolTCP:
			return Duration(DefaultTCPIdleTimeout), true
		case ProtocolHTTP:
			return Duration(DefaultHTTPIdleTimeout), true
		}
		return nil, false // the protocol is refused; no default to add
	},
	// Idle connections park by default where they can: without TLS
	// (crypto/tls may hold the next request, which no poller would see).
	"listeners.park_idle_connections": func(ts []reflect.Value) (any, bool) {
		l := ts[len(ts)-1].Interface().(Listener)
		if l.Protocol != ProtocolHTTP || l.TLS != nil {
			return nil, false
		}
		return new(true), true
	},
	// After drain_time, which it must not be below.
	"server.parent_shutdown_time": func(ts []reflect.Value) (any, bool) {
		return defaultParentShutdown(ts[len(ts)-1].Interface().(Server).DrainTime), true
	},
	// An http listener offers HTTP/2 first; a tcp listener offers what it
	// is told.
	"listeners.tls.alpn": func(ts []reflect.Value) (any, bool) {
		if ts[len(ts)-2].Interface().(Listener).Protocol != ProtocolHTTP {
			return nil, false
		}
		return append([]string(nil), DefaultHTTPALPN...), true
	},
	// Only a route that retries has a number of retries.
	"listeners.routes.num_retries": func(ts []reflect.Value) (any, bool) {
		r := ts[len(ts)-1].Interface().(Route)
		return new(DefaultNumRetries), r.ProxiesToCluster() && len(r.RetryOn) > 0
	},
	// 0 (left out) is the listener's request_timeout.
	"listeners.routes.timeout": func(ts []reflect.Value) (any, bool) {
		return ts[len(ts)-2].Interface().(Listener).RequestTimeout, false
	},
	// 0 (left out) is no bound per try: only the route's timeout.
	"listeners.routes.per_try_timeout": func(ts []reflect.Value) (any, bool) {
		if r := ts[len(ts)-1].Interface().(Route); r.Timeout != 0 {
			return r.Timeout, false
		}
		return ts[len(ts)-2].Interface().(Listener).RequestTimeout, false
	},
	// 0 (left out) never kills: the watchdog only counts (Envoy's default).
	"watchdog.kill_timeout": func([]reflect.Value) (any, bool) { return Duration(0), false },
}

// defaultOf returns the default of f in the tables ts (see
// conditionalDefault), and whether f gets it when left out.
func defaultOf(f *field, ts []reflect.Value) (v reflect.Value, apply bool) {
	if cd, ok := conditionalDefaults[f.path]; ok {
		d, apply := cd(ts)
		if d == nil {
			return reflect.Value{}, false
		}
		return reflect.ValueOf(d), apply
	}
	return f.def, f.hasDef
}

// appliesIn reports whether f applies in its table t: a key declared
// only for some listener protocols does not apply to a listener of
// another (known) protocol, nor to one whose protocol is refused.
func (f *field) appliesIn(t reflect.Value) bool {
	if len(f.only) == 0 {
		return true
	}
	p := t.FieldByName("Protocol")
	if !p.IsValid() {
		panic("config: only tag on " + f.path + ", whose table has no protocol")
	}
	for _, o := range f.only {
		if p.String() == o {
			return true
		}
	}
	return false
}

// applyDefaults gives every key left out of table v (of schema t) its
// default, and walks the tables below. raw is the table as the file has
// it, when fromFile; otherwise (a config built in code) a key is left out
// when its value is the zero value (a nil pointer, a nil slice), which is
// why keys whose 0 means something other than their default are pointers.
func applyDefaults(v reflect.Value, t *table, raw map[string]any, fromFile bool, outer []reflect.Value) {
	ts := append(outer[:len(outer):len(outer)], v)
	for i := range t.fields {
		f := &t.fields[i]
		fv := v.Field(f.index)
		switch f.kind {
		case kTable:
			if fv.Kind() == reflect.Pointer {
				if fv.IsNil() {
					continue
				}
				fv = fv.Elem()
			}
			applyDefaults(fv, f.sub, subTable(raw, f.name), fromFile, ts)
			continue
		case kTables:
			rawElems := tables(raw, f.name)
			for j := 0; j < fv.Len(); j++ {
				applyDefaults(fv.Index(j), f.sub, tableAt(rawElems, j), fromFile, ts)
			}
			continue
		}
		if !f.appliesIn(v) {
			continue
		}
		given := !fv.IsZero()
		if fromFile {
			_, given = raw[f.name]
		}
		if given {
			continue
		}
		if d, apply := defaultOf(f, ts); apply {
			fv.Set(cloneValue(d))
		}
	}
}

// cloneValue copies a default so that no two configs share a slice or a
// pointer target.
func cloneValue(v reflect.Value) reflect.Value {
	switch v.Kind() {
	case reflect.Pointer:
		c := reflect.New(v.Type().Elem())
		c.Elem().Set(v.Elem())
		return c
	case reflect.Slice:
		c := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		reflect.Copy(c, v)
		return c
	}
	return v
}

// bounds checks every integer and duration of table v (schema t, named
// human in messages) against its declared bound, refuses keys set on a
// listener whose protocol they do not apply to, and walks the tables
// below. A zero where a conditional default does not apply is not
// checked: there it means "not set" (a route's timeout left out is the
// listener's request_timeout).
func (v *validator) bounds(val reflect.Value, t *table, human string, outer []reflect.Value) {
	ts := append(outer[:len(outer):len(outer)], val)
	for i := range t.fields {
		f := &t.fields[i]
		fv := val.Field(f.index)
		key := join(human, f.name, ".")
		if !f.appliesIn(val) {
			if p := val.FieldByName("Protocol").String(); (p == ProtocolHTTP || p == ProtocolTCP) && !fv.IsZero() {
				v.ps.add(key, "%s: applies only to %s listeners; remove it", showSet(f, fv), strings.Join(f.only, " and "))
			}
			continue
		}
		switch f.kind {
		case kTable:
			if fv.Kind() == reflect.Pointer {
				if fv.IsNil() {
					continue
				}
				fv = fv.Elem()
			}
			v.bounds(fv, f.sub, key, ts)
			continue
		case kTables:
			for j := 0; j < fv.Len(); j++ {
				e := fv.Index(j)
				name := ""
				if n := e.FieldByName("Name"); n.IsValid() {
					name = n.String()
				}
				v.bounds(e, f.sub, itemKey(key, j, name), ts)
			}
			continue
		}
		if !f.hasBound {
			continue
		}
		if fv.Kind() == reflect.Pointer {
			if fv.IsNil() {
				continue
			}
			fv = fv.Elem()
		}
		def, apply := defaultOf(f, ts)
		if _, conditional := conditionalDefaults[f.path]; conditional && fv.IsZero() && !apply {
			continue // left out where it has no default: not set
		}
		n := fv.Int()
		if n >= f.min && n <= f.max {
			continue
		}
		v.outOfBounds[key] = true
		if f.kind == kDuration {
			msg := "no default"
			if def.IsValid() {
				msg = "the default, " + shortDuration(time.Duration(reflect.Indirect(def).Int()))
			}
			v.ps.add(key, "%q: must be between %s and %s (leave it out for %s)",
				durationString(Duration(n)), shortDuration(time.Duration(f.min)), shortDuration(time.Duration(f.max)), msg)
			continue
		}
		note := f.note
		if strings.Contains(note, "%v") {
			note = fmt.Sprintf(note, reflect.Indirect(def).Interface())
		}
		if note == "" && def.IsValid() {
			note = fmt.Sprintf("leave it out for the default, %v", reflect.Indirect(def).Interface())
		}
		v.ps.add(key, "%d: must be between %d and %d (%s)", n, f.min, f.max, note)
	}
}

// showSet writes a set value for a message that names it.
func showSet(f *field, v reflect.Value) string {
	switch f.kind {
	case kDuration:
		return quote(durationString(Duration(v.Int())))
	case kTables:
		return f.sub.title
	case kBool:
		return strconv.FormatBool(reflect.Indirect(v).Bool())
	}
	return fmt.Sprint(reflect.Indirect(v).Interface())
}

// lookupField returns the schema field at path ("server.drain_time"), or
// nil.
func lookupField(path string) *field {
	t := rootSchema()
	var f *field
	for _, name := range strings.Split(path, ".") {
		if t == nil {
			return nil
		}
		if f = t.field(name); f == nil {
			return nil
		}
		t = f.sub
	}
	return f
}

// boundOf returns the range of the integer or duration key at path.
func boundOf(path string) (lo, hi int64) {
	f := lookupField(path)
	if f == nil || !f.hasBound {
		panic("config: no bound for " + path)
	}
	return f.min, f.max
}
