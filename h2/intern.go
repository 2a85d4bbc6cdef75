package h2

import (
	"strings"

	"golang.org/x/net/http2/hpack"
)

// fieldInterner hands x/net's HPACK Encoder strings it may keep. The
// Encoder keeps the HeaderField strings it adds to its dynamic table
// (and keys its maps with them), so a string over a buffer the caller
// reuses (a proxy's head, read in place) would change under it and
// corrupt the table: a panic in a later search, or the wrong fields
// sent. field returns interned copies instead: made once per distinct
// string, then found with a lookup that allocates nothing, so a steady
// stream of the same fields costs no allocation. The set is bounded;
// past its bound it is emptied (the Encoder's table keeps the copies it
// holds alive on its own). The zero value is ready; not safe for
// concurrent use (the encoder's lock guards it).
type fieldInterner struct {
	m     map[string]string
	bytes int
}

const (
	internMaxEntries = 256
	internMaxBytes   = 16 << 10
	// internMaxField: a field larger than any table we allow is never
	// indexed, so it need not be copied.
	internMaxField = 4096
)

// field returns f with strings the encoder may keep: f itself when it
// is Sensitive (never indexed) or too large to be indexed.
func (in *fieldInterner) field(f hpack.HeaderField) hpack.HeaderField {
	if !f.Sensitive && f.Size() <= internMaxField {
		f.Name, f.Value = in.intern(f.Name), in.intern(f.Value)
	}
	return f
}

func (in *fieldInterner) intern(s string) string {
	if v, ok := in.m[s]; ok {
		return v
	}
	if in.m == nil {
		in.m = make(map[string]string)
	}
	if len(in.m) >= internMaxEntries || in.bytes+len(s) > internMaxBytes {
		clear(in.m)
		in.bytes = 0
	}
	v := strings.Clone(s)
	in.m[v] = v
	in.bytes += len(v)
	return v
}
