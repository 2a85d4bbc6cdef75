package smuggle

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// H2Case is an HTTP/2 request (prior knowledge, cleartext) whose
// pseudo-headers or fields an HTTP/2-to-HTTP/1.1 proxy could copy into
// the request it sends its HTTP/1.1 backend in a form the backend reads
// differently from how the proxy routed it (hotproxy's issue 20, item 4),
// or that an HTTP/1.1 client could not send at all.
type H2Case struct {
	Name string
	// Pseudo are the pseudo-header fields in order; a value of Omit
	// leaves the field out. Fields are more fields: name, value, ...
	Pseudo [][2]string
	Fields []string
	// Status is what a strict proxy answers: "400", or "reset" for a
	// request RFC 9113 calls malformed, whose stream it resets.
	Status string
}

// Omit leaves a pseudo-header field out of an H2Case.
const Omit = "\x00omit"

func h2Get(name, method, authority, path string, fields ...string) H2Case {
	return H2Case{Name: name, Pseudo: [][2]string{{":method", method}, {":scheme", "http"}, {":authority", authority}, {":path", path}},
		Fields: fields, Status: "400"}
}

func reset(c H2Case) H2Case { c.Status = "reset"; return c }

// H2Cases are the request-line and authority cases of issue 20: a space
// in :method or :path (the request line the backend reads gets other
// words: "GET /smuggled-request HTTP/1.1 /x HTTP/1.1"), bytes the
// HTTP/1.1 parser refuses in a target ('\', '#', non-ASCII, control
// bytes), a target form the method does not allow, an :authority that is
// not host[:port], none at all, and a Host that disagrees with it.
func H2Cases() []H2Case {
	return []H2Case{
		h2Get("space in :method", "GET "+Marker+" HTTP/1.1", "x", "/x"),
		h2Get("non-token :method", "G(T", "x", "/x"),
		h2Get("space in :path", "GET", "x", "/x HTTP/1.1"),
		h2Get("backslash in :path", "GET", "x", "/x\\..\\admin"),
		h2Get("fragment in :path", "GET", "x", "/x#frag"),
		h2Get("non-ASCII byte in :path", "GET", "x", "/caf\xe9"),
		h2Get("asterisk :path for GET", "GET", "x", "*"),
		reset(h2Get("CR LF in :path", "GET", "x", "/x\r\n"+smuggled)),
		reset(h2Get("NUL in :path", "GET", "x", "/x\x00")),
		reset(h2Get("relative :path", "GET", "x", "x")),
		reset(h2Get("CR LF in a field", "GET", "x", "/x", "x-a", "a\r\n"+smuggled)),
		h2Get(":authority a list", "GET", "a,b", "/x"),
		h2Get(":authority with a semicolon", "GET", "x;y", "/x"),
		h2Get(":authority with an empty label", "GET", "x..y", "/x"),
		h2Get("no :authority nor Host", "GET", Omit, "/x"),
		reset(h2Get("Host disagreeing with :authority", "GET", "a.example", "/x", "host", "b.example")),
	}
}

// H2Result is what one H2Case did.
type H2Result struct {
	H2Case
	Answer  string // "400", another status, or "reset <code>"
	Reached string // what the backend received while the case ran
}

// Smuggled reports whether the hidden request reached the backend.
func (r H2Result) Smuggled() bool { return strings.Contains(r.Reached, Marker) }

// Strict reports whether the proxy answered as hotproxy holds itself to:
// the expected status (or a reset with PROTOCOL_ERROR) and nothing
// forwarded.
func (r H2Result) Strict() bool {
	want := r.Status
	if want == "reset" {
		want = "reset " + http2.ErrCodeProtocol.String()
	}
	return r.Answer == want && r.Reached == ""
}

// RunH2 sends c on a fresh HTTP/2 cleartext connection (prior knowledge)
// to the proxy at proxyAddr, in front of b. Only one case may run at a
// time against one backend.
func RunH2(proxyAddr string, b *Backend, c H2Case) (H2Result, error) {
	r := H2Result{H2Case: c}
	before := len(b.received())
	conn, err := net.DialTimeout("tcp", proxyAddr, 5*time.Second)
	if err != nil {
		return r, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		return r, err
	}
	if err := fr.WriteSettings(); err != nil {
		return r, err
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range c.Pseudo {
		if f[1] != Omit {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
	}
	for i := 0; i+1 < len(c.Fields); i += 2 {
		enc.WriteField(hpack.HeaderField{Name: c.Fields[i], Value: c.Fields[i+1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		return r, err
	}
	r.Answer, err = readH2Answer(fr)
	// Let whatever the proxy forwards settle before reading the backend.
	time.Sleep(50 * time.Millisecond)
	r.Reached = b.received()[before:]
	return r, err
}

// readH2Answer reads frames until stream 1's response head or reset.
func readH2Answer(fr *http2.Framer) (string, error) {
	for range 100 {
		f, err := fr.ReadFrame()
		if err != nil {
			return "", fmt.Errorf("reading the answer to stream 1: %w", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				status := f.PseudoValue("status")
				if _, err := strconv.Atoi(status); err != nil {
					return "", fmt.Errorf("stream 1: response without a :status")
				}
				return status, nil
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return "reset " + f.ErrCode.String(), nil
			}
		case *http2.GoAwayFrame:
			return "goaway " + f.ErrCode.String(), nil
		}
	}
	return "", fmt.Errorf("no answer to stream 1 in 100 frames")
}
