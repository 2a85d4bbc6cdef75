package config

import (
	"errors"
	"strings"
	"testing"
)

// TestKeyLines: the line of each key, through tables, arrays of tables
// nested in arrays of tables, inline tables (the enclosing key's line) and
// multi-line strings (whose lines are not keys).
func TestKeyLines(t *testing.T) {
	data := []byte(`[server]
drain_time = "1s"

[[listeners]]
name = "a"
  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 700 }

[[listeners]]
name = "b"
body = """
name = "not a key"
"""
  [[listeners.routes]]
  prefix = "/x"
  [[listeners.routes]]
  prefix = "/y"
[[clusters]]
name = "c"
endpoints = [
  "1.2.3.4:80",
]
`)
	lines := keyLines(data)
	for key, want := range map[string]int{
		"server.drain_time":                                   2,
		`listeners[0] ("a").name`:                             5,
		`listeners[0] ("a").routes[0].prefix`:                 7,
		`listeners[0] ("a").routes[0].direct_response.status`: 8,
		`listeners[1] ("b").name`:                             11,
		`listeners[1] ("b").routes[0].prefix`:                 16,
		`listeners[1] ("b").routes[1].prefix`:                 18,
		`listeners[1] ("b").routes[1].cluster`:                17, // missing: its table's header
		`clusters[0] ("c").endpoints[0]`:                      21,
		"admin.address":                                       0,
	} {
		if got := lineOf(lines, key); got != want {
			t.Errorf("%s: line %d, want %d", key, got, want)
		}
	}
}

// TestValueErrorHasLine (issue 15): an error about a value names its line,
// after the key and the value, which still lead the message.
func TestValueErrorHasLine(t *testing.T) {
	_, err := Parse([]byte("[server]\n\ndrain_time = \"1ms\"\n"), "v.toml")
	var e *Error
	if !errors.As(err, &e) || len(e.Problems) != 1 || e.Problems[0].Line != 3 {
		t.Fatalf("Parse: %v, want one problem on line 3", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, `v.toml: server.drain_time: "1ms": `) || !strings.HasSuffix(msg, "(line 3)") {
		t.Errorf("message %q: want the key and value first and (line 3) last", msg)
	}
}
