package h2

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawClient speaks frames by hand, so tests can misbehave on purpose.
type rawClient struct {
	t          testing.TB
	c          net.Conn
	fr         *http2.Framer
	enc        *hpack.Encoder
	buf        bytes.Buffer
	hd         *hpack.Decoder
	lastStatus string
	goAway     *http2.GoAwayFrame // the last GOAWAY get saw
}

func (rc *rawClient) dec() *hpack.Decoder {
	if rc.hd == nil {
		rc.hd = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
			if f.Name == ":status" {
				rc.lastStatus = f.Value
			}
		})
	}
	return rc.hd
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc := &rawClient{t: t, c: c}
	rc.fr = http2.NewFramer(c, c)
	rc.fr.SetMaxReadFrameSize(1<<24 - 1)
	rc.enc = hpack.NewEncoder(&rc.buf)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return rc
}

// block encodes a GET for path with optional extra fields.
func (rc *rawClient) block(method, path string, extra ...hpack.HeaderField) []byte {
	rc.buf.Reset()
	rc.enc.WriteField(hpack.HeaderField{Name: ":method", Value: method})
	rc.enc.WriteField(hpack.HeaderField{Name: ":scheme", Value: "http"})
	rc.enc.WriteField(hpack.HeaderField{Name: ":authority", Value: "example.test"})
	rc.enc.WriteField(hpack.HeaderField{Name: ":path", Value: path})
	for _, f := range extra {
		rc.enc.WriteField(f)
	}
	return append([]byte(nil), rc.buf.Bytes()...)
}

func (rc *rawClient) headers(id uint32, block []byte, end bool) error {
	return rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: end, EndHeaders: true})
}

// goAwayResult is what a connection ended with.
type goAwayResult struct {
	sawGoAway bool
	code      http2.ErrCode
	lastID    uint32
	closed    bool // EOF or reset after (or without) the GOAWAY
}

// awaitGoAway reads (and discards) frames until a GOAWAY with an error code
// (or any GOAWAY when anyCode) arrives and the connection closes, or the
// deadline passes.
func (rc *rawClient) awaitGoAway(within time.Duration) goAwayResult {
	var res goAwayResult
	rc.c.SetReadDeadline(time.Now().Add(within))
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return res
			}
			res.closed = true
			return res
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			res.sawGoAway, res.code, res.lastID = true, g.ErrCode, g.LastStreamID
		}
	}
}

// get sends one GET and waits for its complete response status.
func (rc *rawClient) get(id uint32, path string, within time.Duration) (status string, body []byte, err error) {
	if err := rc.headers(id, rc.block("GET", path), true); err != nil {
		return "", nil, err
	}
	return rc.readResponse(id, within)
}

// readResponse reads frames until stream id's response ends.
func (rc *rawClient) readResponse(id uint32, within time.Duration) (status string, body []byte, err error) {
	rc.c.SetReadDeadline(time.Now().Add(within))
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			return status, body, err
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if f.StreamID == id {
				if _, err := rc.dec().Write(f.HeaderBlockFragment()); err != nil {
					return "", nil, err
				}
				status = rc.lastStatus
				if f.StreamEnded() {
					return status, body, nil
				}
			}
		case *http2.DataFrame:
			if f.StreamID == id {
				body = append(body, f.Data()...)
				if f.StreamEnded() {
					return status, body, nil
				}
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return status, body, http2.StreamError{StreamID: id, Code: f.ErrCode}
			}
		case *http2.GoAwayFrame:
			g := *f
			rc.goAway = &g
			if f.ErrCode != http2.ErrCodeNo {
				return status, body, http2.ConnectionError(f.ErrCode)
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				rc.fr.WriteSettingsAck()
			}
		}
	}
}
