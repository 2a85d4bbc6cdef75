package config

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The schema is derived from the toml tags of Config, so that the checks
// for unknown keys and wrong types cannot drift from the types.

type kind int

const (
	kString   kind = iota
	kInt           // int
	kBool          // bool or *bool
	kDuration      // Duration, written as a string
	kStrings       // []string
	kInts          // []int
	kTable         // struct or *struct
	kTables        // []struct: an array of tables
)

type field struct {
	name  string
	path  string // in the schema, indices left out: "listeners.idle_timeout"
	index int    // of the struct field
	kind  kind
	sub   *table // for kTable and kTables

	// The key's declaration, from its tags (declare.go).
	def      reflect.Value // the default, when hasDef
	hasDef   bool
	min, max int64 // the bound (nanoseconds for a duration), when hasBound
	hasBound bool
	note     string
	only     []string
}

type table struct {
	title  string // how the user writes it: "[server]", "[[listeners]]"
	fields []field
}

func (t *table) field(name string) *field {
	for i := range t.fields {
		if t.fields[i].name == name {
			return &t.fields[i]
		}
	}
	return nil
}

func (t *table) names() []string {
	ns := make([]string, len(t.fields))
	for i, f := range t.fields {
		ns[i] = f.name
	}
	return ns
}

var rootSchema = sync.OnceValue(func() *table {
	return schemaOf(reflect.TypeFor[Config](), "", "")
})

var durationType = reflect.TypeFor[Duration]()

func schemaOf(t reflect.Type, path, title string) *table {
	tb := &table{title: title}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("toml"), ",")
		if name == "-" || !sf.IsExported() {
			continue
		}
		if name == "" {
			panic("config: field " + sf.Name + " has no toml tag")
		}
		full := name
		if path != "" {
			full = path + "." + name
		}
		f := field{name: name, path: full, index: i}
		ft := sf.Type
		switch {
		case ft == durationType:
			f.kind = kDuration
		case ft.Kind() == reflect.String, ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.String:
			// *string: a key whose "" is a value, not its absence.
			f.kind = kString
		case ft.Kind() == reflect.Int, ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Int:
			// *int: a key whose 0 means something other than its default.
			f.kind = kInt
		case ft.Kind() == reflect.Bool, ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Bool:
			f.kind = kBool
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.String:
			f.kind = kStrings
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Int:
			f.kind = kInts
		case ft.Kind() == reflect.Struct:
			f.kind, f.sub = kTable, schemaOf(ft, full, "["+full+"]")
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
			f.kind, f.sub = kTable, schemaOf(ft.Elem(), full, full)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			f.kind, f.sub = kTables, schemaOf(ft.Elem(), full, "[["+full+"]]")
		default:
			panic("config: field " + sf.Name + ": type " + ft.String() + " not supported by the schema")
		}
		f.parseTags(sf)
		tb.fields = append(tb.fields, f)
	}
	return tb
}

// schemaKeys lists every key path of the schema, indices left out:
// "server.drain_time", "listeners.routes.direct_response.status". Tables
// are listed too.
func schemaKeys() []string {
	var keys []string
	var walk func(t *table, prefix string)
	walk = func(t *table, prefix string) {
		for _, f := range t.fields {
			k := prefix + f.name
			keys = append(keys, k)
			if f.sub != nil {
				walk(f.sub, k+".")
			}
		}
	}
	walk(rootSchema(), "")
	return keys
}

// checker walks the generic decoding of a file against the schema and
// finds unknown keys and values of the wrong type.
type checker struct {
	problems problems
	badType  bool // a value has the wrong type: the typed decode would fail
	homes    map[string][]string
}

// homesOf maps each key name to the titles of the tables that have it.
func homesOf(t *table, m map[string][]string) map[string][]string {
	if m == nil {
		m = map[string][]string{}
	}
	for _, f := range t.fields {
		if !slices.Contains(m[f.name], t.title) {
			m[f.name] = append(m[f.name], t.title)
		}
		if f.sub != nil {
			homesOf(f.sub, m)
		}
	}
	return m
}

// check walks m, a table of the file. human is the path used in messages
// (`listeners[0] ("web")`), empty at the root.
func (c *checker) check(t *table, m map[string]any, human string) {
	var unknown []string
	for k := range m {
		if t.field(k) == nil {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		c.unknown(t, k, join(human, keyPart(k), "."))
	}
	for _, f := range t.fields {
		v, ok := m[f.name]
		if !ok {
			continue
		}
		c.value(&f, v, join(human, f.name, "."))
	}
}

func (c *checker) unknown(t *table, k, key string) {
	msg := "unknown key"
	if s := closest(k, t.names()); s != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", s)
	} else if homes := c.homes[k]; len(homes) > 0 && t.title != "" {
		msg += fmt.Sprintf(" (%s is a key of %s, not of %s)", k, strings.Join(homes, " and "), t.title)
	} else if homes := c.homes[k]; len(homes) > 0 {
		msg += fmt.Sprintf(" (%s is a key of %s; put it in that table)", k, strings.Join(homes, " and "))
	} else {
		msg += fmt.Sprintf(" (%s has %s)", describe(t), strings.Join(t.names(), ", "))
	}
	c.problems.add(key, "%s", msg)
}

func describe(t *table) string {
	if t.title == "" {
		return "the top level"
	}
	return t.title
}

func (c *checker) value(f *field, v any, human string) {
	bad := func(want string) {
		c.badType = true
		c.problems.add(human, "expected %s, got %s", want, show(v))
	}
	switch f.kind {
	case kString:
		if _, ok := v.(string); !ok {
			bad("a string")
		}
	case kInt:
		n, ok := v.(int64)
		if !ok {
			bad("an integer")
		} else if n > math.MaxInt || n < math.MinInt {
			bad("a smaller integer")
		}
	case kBool:
		if _, ok := v.(bool); !ok {
			bad("true or false")
		}
	case kDuration:
		s, ok := v.(string)
		if !ok {
			bad(`a duration string like "30s"`)
			return
		}
		if _, err := time.ParseDuration(s); err != nil {
			c.badType = true
			c.problems.add(human, "invalid duration %s (write it like \"500ms\", \"30s\" or \"1m\")", quote(s))
		}
	case kStrings:
		arr, ok := v.([]any)
		if !ok {
			if s, isStr := v.(string); isStr {
				c.badType = true
				c.problems.add(human, "expected an array of strings, got string %s (write %s = [%s])", quote(s), f.name, quote(s))
				return
			}
			bad("an array of strings")
			return
		}
		for i, e := range arr {
			if _, ok := e.(string); !ok {
				c.badType = true
				c.problems.add(fmt.Sprintf("%s[%d]", human, i), "expected a string, got %s", show(e))
			}
		}
	case kInts:
		arr, ok := v.([]any)
		if !ok {
			if n, isInt := v.(int64); isInt {
				c.badType = true
				c.problems.add(human, "expected an array of integers, got integer %d (write %s = [%d])", n, f.name, n)
				return
			}
			bad("an array of integers")
			return
		}
		for i, e := range arr {
			n, ok := e.(int64)
			if !ok || n > math.MaxInt32 || n < math.MinInt32 {
				c.badType = true
				c.problems.add(fmt.Sprintf("%s[%d]", human, i), "expected an integer, got %s", show(e))
			}
		}
	case kTable:
		sub, ok := v.(map[string]any)
		if !ok {
			bad("a table")
			return
		}
		c.check(f.sub, sub, human)
	case kTables:
		elems, ok := tableList(v)
		if !ok {
			c.badType = true
			if _, isTable := v.(map[string]any); isTable {
				c.problems.add(human, "expected an array of tables, got a single table (write %s, with double brackets, for each entry)", f.sub.title)
			} else {
				c.problems.add(human, "expected an array of tables, got %s (write %s for each entry)", show(v), f.sub.title)
			}
			return
		}
		for i, e := range elems {
			h := fmt.Sprintf("%s[%d]", human, i)
			sub, ok := e.(map[string]any)
			if !ok {
				c.badType = true
				c.problems.add(h, "expected a table, got %s", show(e))
				continue
			}
			if name, ok := sub["name"].(string); ok && name != "" {
				h += " (" + quote(name) + ")"
			}
			c.check(f.sub, sub, h)
		}
	}
}

// tableList returns v as a list of elements if it is an array: an array
// of tables ([[x]]) decodes as []map[string]any, an inline array as []any.
func tableList(v any) ([]any, bool) {
	switch v := v.(type) {
	case []map[string]any:
		out := make([]any, len(v))
		for i := range v {
			out[i] = v[i]
		}
		return out, true
	case []any:
		return v, true
	}
	return nil, false
}

// tables returns m[key] as a list of tables; elements that are not tables
// are nil.
func tables(m map[string]any, key string) []map[string]any {
	l, _ := tableList(m[key])
	out := make([]map[string]any, len(l))
	for i, e := range l {
		out[i], _ = e.(map[string]any)
	}
	return out
}

// tableAt is the i-th table of ts, or nil when the file has fewer (a
// config built in code has none at all).
func tableAt(ts []map[string]any, i int) map[string]any {
	if i < len(ts) {
		return ts[i]
	}
	return nil
}

func subTable(m map[string]any, key string) map[string]any {
	sub, _ := m[key].(map[string]any)
	return sub
}

// show describes a decoded TOML value for a message: `string "two"`.
func show(v any) string {
	switch v := v.(type) {
	case string:
		return "string " + quote(v)
	case int64:
		return "integer " + strconv.FormatInt(v, 10)
	case float64:
		return "float " + strconv.FormatFloat(v, 'g', -1, 64)
	case bool:
		return "boolean " + strconv.FormatBool(v)
	case map[string]any:
		return "a table"
	case []map[string]any, []any:
		return "an array"
	case time.Time:
		return "datetime " + v.Format(time.RFC3339Nano)
	case fmt.Stringer: // the toml package's local dates and times
		return "datetime " + v.String()
	}
	return fmt.Sprintf("%T", v)
}

// keyPart writes one key of a dotted path as TOML would: bare when it can
// be, quoted otherwise.
func keyPart(k string) string {
	if k == "" {
		return `""`
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return strconv.Quote(k)
		}
	}
	return k
}

func join(a, b, sep string) string {
	if a == "" {
		return b
	}
	return a + sep + b
}
