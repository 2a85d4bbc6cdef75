package config

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is matched, with errors.Is, by every error that Parse, Load and
// Validate return for a config that is malformed or wrong (as opposed to a
// file that cannot be read).
var ErrInvalid = errors.New("invalid config")

// Error lists every problem found in one config. Its message has one line
// per problem, each starting with the source.
type Error struct {
	Source   string
	Problems []Problem
}

// Problem is one thing wrong with a config.
type Problem struct {
	// Key is the key path, like `server.drain_time` or
	// `listeners[0] ("web").address`; empty for problems of the file as a
	// whole (syntax, unknown keys).
	Key string
	// Line and Column locate a syntax error; Line alone, the key of a
	// value error (or the nearest key enclosing it: keylines.go); 0 when
	// not known.
	Line, Column int
	// Msg says what is wrong, quoting the value, and what to do.
	Msg string
	// Context shows the lines around a syntax error; may be empty.
	Context string
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Line > 0 && p.Column > 0 {
		fmt.Fprintf(&b, "line %d, column %d: ", p.Line, p.Column)
	}
	if p.Key != "" {
		b.WriteString(p.Key)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	if p.Line > 0 && p.Column == 0 {
		// A value error: the key and value lead, as they always did; the
		// line follows, for an editor's "go to line".
		fmt.Fprintf(&b, " (line %d)", p.Line)
	}
	if p.Context != "" {
		b.WriteString("\n")
		b.WriteString(strings.TrimRight(p.Context, "\n"))
	}
	return b.String()
}

func (e *Error) Error() string {
	prefix := ""
	if e.Source != "" {
		prefix = e.Source + ": "
	}
	if len(e.Problems) == 0 {
		return prefix + "invalid config"
	}
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = prefix + p.String()
	}
	return strings.Join(lines, "\n")
}

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// problems collects Problems in the order they are found.
type problems []Problem

func (ps *problems) add(key, format string, args ...any) {
	*ps = append(*ps, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// err returns ps as an *Error, or nil (an untyped nil) when ps is empty.
func (ps problems) err(source string) error {
	if len(ps) == 0 {
		return nil
	}
	return &Error{Source: source, Problems: ps}
}

// quote quotes a value for a message, shortening very long ones.
func quote(s string) string {
	const max = 80
	if len(s) > max {
		cut := max
		for cut > 0 && s[cut]&0xC0 == 0x80 { // don't split a UTF-8 sequence
			cut--
		}
		return fmt.Sprintf("%q…", s[:cut])
	}
	return fmt.Sprintf("%q", s)
}

// closest returns the candidate nearest to s (a likely typo), or "".
func closest(s string, candidates []string) string {
	best, bestDist := "", 0
	for _, c := range candidates {
		if strings.EqualFold(s, c) {
			return c
		}
		d := editDistance(strings.ToLower(s), strings.ToLower(c))
		limit := 2
		if len(c) <= 4 {
			limit = 1
		}
		if d <= limit && (best == "" || d < bestDist) {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes,
// giving up (returning a large number) on long inputs.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
