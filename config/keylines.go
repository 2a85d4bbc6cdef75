package config

import (
	"bufio"
	"bytes"
	"cmp"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Value errors carry the line of their key, as syntax errors do. The TOML
// decoder keeps its key positions private, so the lines are found again
// from the text: table headers ([a.b], [[a.b]], counting the elements of
// each array of tables) and `key = value` lines. The result is best effort
// by design: a key inside an inline table or an inline array of tables
// (routes = [{ ... }]) gets the line of the nearest key that encloses it,
// which is where a reader would look anyway.

// keyLines maps key paths in the form of Problem.Key without the names
// (listeners[0].routes[1].prefix) to the line they are on. data has
// already been decoded: it is valid TOML.
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	counts := map[string]int{} // array-of-tables path (with parent indices) → elements so far
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), len(data)+1)
	inMultiline := false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		// Skip the insides of multi-line strings: a line there is text,
		// not a key.
		if c := strings.Count(line, `"""`) + strings.Count(line, `'''`); c%2 == 1 {
			inMultiline = !inMultiline
			if !inMultiline {
				continue
			}
		} else if inMultiline {
			continue
		}
		switch {
		case strings.HasPrefix(line, "[["):
			name, ok := headerName(line, "[[", "]]")
			if !ok {
				continue
			}
			path := resolveTable(name, counts, true)
			i := counts[path]
			counts[path] = i + 1
			table = path + "[" + strconv.Itoa(i) + "]"
			lines[table] = n
		case strings.HasPrefix(line, "["):
			name, ok := headerName(line, "[", "]")
			if !ok {
				continue
			}
			table = resolveTable(name, counts, false)
			lines[table] = n
		default:
			if m := keyLine.FindStringSubmatch(line); m != nil {
				key := strings.Join(strings.Fields(m[1]), "")
				if table != "" {
					key = table + "." + key
				}
				if _, seen := lines[key]; !seen {
					lines[key] = n
				}
			}
		}
	}
	return lines
}

// keyLine matches `key = ...` and `a.b = ...` with bare keys.
var keyLine = regexp.MustCompile(`^([A-Za-z0-9_-]+(?:\s*\.\s*[A-Za-z0-9_-]+)*)\s*=`)

func headerName(line, open, close string) (string, bool) {
	end := strings.Index(line, close)
	if end < 0 {
		return "", false
	}
	name := strings.TrimSpace(line[len(open):end])
	return strings.ReplaceAll(name, " ", ""), name != ""
}

// resolveTable turns a header's dotted name into a path with the indices
// of the arrays of tables it is inside: [[listeners.routes]] after the
// second [[listeners]] is listeners[1].routes. The last segment of an
// [[array]] header is left without an index: the caller adds the new one.
func resolveTable(name string, counts map[string]int, arrayHeader bool) string {
	segs := strings.Split(name, ".")
	path := ""
	for i, seg := range segs {
		if path != "" {
			path += "."
		}
		path += seg
		if arrayHeader && i == len(segs)-1 {
			break
		}
		if n := counts[path]; n > 0 {
			path += "[" + strconv.Itoa(n-1) + "]"
		}
	}
	return path
}

// namePart is the ` ("web")` a Problem.Key carries after an index.
var namePart = regexp.MustCompile(` \("(?:[^"\\]|\\.)*"\)`)

// lineOf is the line of key (a Problem.Key) or of the nearest key that
// encloses it; 0 when none is found.
func lineOf(lines map[string]int, key string) int {
	k := namePart.ReplaceAllString(key, "")
	for k != "" {
		if n, ok := lines[k]; ok {
			return n
		}
		i := strings.LastIndexAny(k, ".[")
		if i < 0 {
			return 0
		}
		k = k[:i]
	}
	return 0
}

// locate gives the problems about a key the line of that key.
func (ps problems) locate(data []byte) {
	var lines map[string]int
	for i := range ps {
		if ps[i].Key == "" || ps[i].Line != 0 {
			continue
		}
		if lines == nil {
			lines = keyLines(data)
		}
		ps[i].Line = lineOf(lines, ps[i].Key)
	}
}

// sortByLine puts located problems in the order of the file: Validate
// checks the bounds of every key before the rules that relate keys, and a
// reader goes down the file. Problems without a line come last.
func (ps problems) sortByLine() {
	at := func(p Problem) int {
		if p.Line == 0 {
			return math.MaxInt
		}
		return p.Line
	}
	slices.SortStableFunc(ps, func(a, b Problem) int { return cmp.Compare(at(a), at(b)) })
}
