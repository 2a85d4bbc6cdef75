package config

import (
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestExampleDocumentsTheDeclarations reads the comments of
// examples/hotproxy.toml against the declaration of every key (declare.go):
// where a key has a bound, the text that documents it states the bound's
// maximum, and where it has a default, that default. The values the example
// sets are TestExampleShowsDefaults' business; this is about the words.
func TestExampleDocumentsTheDeclarations(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	docs := exampleDocs(string(data))
	checked := 0
	var walk func(tb *table, title string)
	walk = func(tb *table, title string) {
		for i := range tb.fields {
			f := &tb.fields[i]
			if f.sub != nil {
				walk(f.sub, f.path)
				continue
			}
			// The key's own paragraphs, its table's introduction, and
			// the paragraph of the key that holds its table (a table
			// written inline, like direct_response).
			texts := append(docs[f.name], docs["["+title+"]"]...)
			texts = append(texts, docs[title[strings.LastIndex(title, ".")+1:]]...)
			if len(texts) == 0 && (f.hasBound || f.hasDef) {
				t.Errorf("%s: no comment of examples/hotproxy.toml documents it", f.path)
				continue
			}
			if f.hasBound {
				checked++
				if !mentions(texts, f.kind, f.max) {
					t.Errorf("%s: the example does not state its maximum %s (declared bound:%q)", f.path, show64(f.kind, f.max), boundText(f))
				}
			}
			if _, conditional := conditionalDefaults[f.path]; f.hasDef && !conditional && f.kind != kTable && f.kind != kTables {
				checked++
				if v := reflect.Indirect(f.def).Interface(); !mentionsValue(texts, v) {
					if d, ok := v.(Duration); ok {
						v = shortDuration(d.D())
					}
					t.Errorf("%s: the example does not state its default %v (declared default:)", f.path, v)
				}
			}
		}
	}
	walk(rootSchema(), "")
	if checked < 60 {
		t.Fatalf("only %d declarations checked: the walk proves nothing", checked)
	}
}

var (
	// "# name: text", "#   name   text" (a table of keys), "name = v  # text".
	docColon  = regexp.MustCompile(`^\s*#\s*(\[[a-z_.]+\]|[a-z0-9_]+):\s`)
	docColumn = regexp.MustCompile(`^\s*#\s+([a-z0-9_]+)\s{2,}\S`)
	docInline = regexp.MustCompile(`^\s*([a-z0-9_]+)\s*=[^#]*#\s*(.*)$`)
	docTokens = regexp.MustCompile(`"[^"]*"|\b[0-9][0-9a-z.]*\b|\btrue\b|\bfalse\b`)
)

// exampleDocs maps a key's name (or a table's "[title]") to the comment
// paragraphs that document it: the line that names it and the comment
// lines that follow, up to the next that names a key.
func exampleDocs(data string) map[string][]string {
	docs := map[string][]string{}
	name, para := "", ""
	flush := func() {
		if name != "" {
			docs[name] = append(docs[name], para)
		}
		name, para = "", ""
	}
	for _, line := range strings.Split(data, "\n") {
		if m := docInline.FindStringSubmatch(line); m != nil {
			flush()
			name, para = m[1], m[2]
			continue
		}
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			flush()
			continue
		}
		if m := docColon.FindStringSubmatch(line); m != nil {
			flush()
			name = m[1]
		} else if m := docColumn.FindStringSubmatch(line); m != nil {
			flush()
			name = m[1]
		}
		para += line + "\n"
	}
	flush()
	return docs
}

// mentions reports whether one of texts holds the number n of kind k (a
// duration in any spelling: "90s" is "1m30s").
func mentions(texts []string, k kind, n int64) bool {
	for _, text := range texts {
		for _, tok := range docTokens.FindAllString(text, -1) {
			tok = strings.Trim(tok, `"`)
			if k == kDuration {
				if d, err := time.ParseDuration(tok); err == nil && int64(d) == n {
					return true
				}
			} else if v, err := strconv.ParseInt(tok, 10, 64); err == nil && v == n {
				return true
			}
		}
	}
	return false
}

func mentionsValue(texts []string, v any) bool {
	switch v := v.(type) {
	case Duration:
		return mentions(texts, kDuration, int64(v))
	case int:
		return mentions(texts, kInt, int64(v))
	case []int:
		return len(v) == 1 && mentions(texts, kInt, int64(v[0]))
	case bool:
		return mentions(texts, kBool, 0) || containsIn(texts, strconv.FormatBool(v))
	case string:
		return containsIn(texts, strconv.Quote(v)) || containsIn(texts, v)
	case []string:
		quoted := make([]string, len(v))
		for i, s := range v {
			quoted[i] = strconv.Quote(s)
		}
		return containsIn(texts, "["+strings.Join(quoted, ", ")+"]")
	}
	return false
}

// containsIn reports whether one of texts holds s, reading the text of
// the comments, however its lines wrap.
func containsIn(texts []string, s string) bool {
	for _, text := range texts {
		var words []string
		for _, line := range strings.Split(text, "\n") {
			words = append(words, strings.Fields(strings.TrimLeft(strings.TrimSpace(line), "#"))...)
		}
		if strings.Contains(strings.Join(words, " "), strings.Join(strings.Fields(s), " ")) {
			return true
		}
	}
	return false
}

func show64(k kind, n int64) string {
	if k == kDuration {
		return shortDuration(time.Duration(n))
	}
	return strconv.FormatInt(n, 10)
}

func boundText(f *field) string { return show64(f.kind, f.min) + ".." + show64(f.kind, f.max) }
