package h2

import (
	"fmt"
	"net/http"
	"testing"
	"unsafe"

	"golang.org/x/net/http2/hpack"
)

// TestClientRequestHeadOverReusedBuffer: a proxy builds each request
// head over a buffer it reuses (the HTTP/1.1 read buffer, its scratch
// for lower-cased names), so the strings it hands OpenStream change
// once the call returns. x/net's HPACK encoder keeps the strings it
// indexes: without the client's copies, a later request's search of the
// corrupted table panicked ("id (179) <= evictCount (180)") or sent the
// wrong fields. Every request here must reach x/net's server with its
// own values.
func TestClientRequestHeadOverReusedBuffer(t *testing.T) {
	addr := clientXNetServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-got", r.Header.Get("X-Value")+"|"+r.Header.Get("X-Name-"+r.Header.Get("X-Key")))
		w.WriteHeader(200)
	}))
	cc := clientDial(t, addr, nil)
	buf := make([]byte, 0, 256)
	str := func(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
	const n = 600 // enough distinct fields to evict from a 4096-byte table many times
	for i := range n {
		buf = buf[:0]
		buf = fmt.Appendf(buf, "value-%04d-%s", i, "padding-to-fill-the-dynamic-table-quickly")
		value := str(buf)
		start := len(buf)
		buf = fmt.Appendf(buf, "x-name-%d", i%7)
		name := str(buf[start:])
		start = len(buf)
		buf = fmt.Appendf(buf, "%d", i%7)
		key := str(buf[start:])
		h := &RequestHead{Method: "GET", Scheme: "http", Authority: "example", Path: "/", EndStream: true,
			Fields: []hpack.HeaderField{{Name: "x-value", Value: value}, {Name: name, Value: value}, {Name: "x-key", Value: key}}}
		want := value + "|" + value
		want = string(append([]byte(nil), want...)) // before the buffer is scribbled on
		status, fields, _, _, err := clientRoundTrip(t, cc, h)
		// The caller reuses its buffer at once.
		for k := range buf {
			buf[k] = '#'
		}
		if err != nil || status != 200 {
			t.Fatalf("request %d: status %d, %v", i, status, err)
		}
		if got := clientField(fields, "x-got"); got != want {
			t.Fatalf("request %d: the server got %q, want %q", i, got, want)
		}
	}
}
