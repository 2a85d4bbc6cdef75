package exchange

import (
	"io"

	"github.com/hotproxy/hotproxy/http1"
)

// BodySink is a front end as the core moves an HTTP/1.1 upstream's
// response body to its client: the upstream's read buffer is refilled by
// ReadUpstream (ReadMore, with the front end's buffers, idle timeout and
// the read deadline it last set, which it keeps: a pointer to a local
// passed through this interface would escape, an allocation per
// response) and what is read goes out through WriteBody, a piece at a
// time, as it comes. The HTTP/1.1 front end writes to its connection, the HTTP/2
// one DATA frames of its stream.
type BodySink interface {
	ReadUpstream() error
	// WriteBody writes p; last says it ends the body (known only for a
	// body with a length): an HTTP/2 stream sends it in the frame that
	// ends the stream.
	WriteBody(p []byte, last bool) error
}

// ChunkSink is a BodySink that takes a chunked body decoded: Chunk gets
// each chunk's data, and with the last one (done) the trailer section
// (validated by the decoder, possibly empty). FlushChunks is called
// before the core waits for more of the body, so that nothing the
// upstream sent waits in the proxy meanwhile.
type ChunkSink interface {
	BodySink
	Chunk(data, trailer []byte, done bool) error
	FlushChunks() error
}

// errMalformedChunks: the upstream's chunked body does not parse; the
// client gets a 502 if nothing was sent yet.
var errMalformedChunks = &http1.Error{Status: 502, Reason: "upstream sent a malformed chunked body"}

// CopyLength moves the next n bytes of a body from rb, refilled by
// sink.ReadUpstream when it runs dry, to sink.WriteBody.
func CopyLength(rb *ReadBuffer, n int64, sink BodySink) error {
	for n > 0 {
		if rb.R == rb.W {
			if err := sink.ReadUpstream(); err != nil {
				return err
			}
		}
		k := min(n, int64(rb.W-rb.R))
		if err := sink.WriteBody(rb.B[rb.R:rb.R+int(k)], k == n); err != nil {
			return err
		}
		rb.R += int(k)
		n -= k
	}
	return nil
}

// CopyChunked decodes a chunked body from rb with d (reset here) and
// hands it to sink, chunk by chunk, until the last chunk and its
// trailers; a malformed body is a 502 (*http1.Error).
func CopyChunked(rb *ReadBuffer, d *http1.ChunkedDecoder, sink ChunkSink) error {
	d.Reset()
	for {
		for rb.R < rb.W {
			n, data, trailer, done, err := d.Next(rb.B[rb.R:rb.W])
			if err != nil {
				return errMalformedChunks
			}
			if n == 0 {
				break
			}
			// data and trailer stay valid until the next refill.
			rb.R += n
			if err := sink.Chunk(data, trailer, done); err != nil || done {
				return err
			}
		}
		if err := sink.FlushChunks(); err != nil {
			return err
		}
		if err := sink.ReadUpstream(); err != nil {
			return err
		}
	}
}

// CopyUntilClose moves a body that ends with the upstream connection
// (neither a length nor chunked): what rb holds, then everything read
// until EOF, which ends it without an error.
func CopyUntilClose(rb *ReadBuffer, sink BodySink) error {
	for {
		if rb.R < rb.W {
			if err := sink.WriteBody(rb.B[rb.R:rb.W], false); err != nil {
				return err
			}
			rb.R = rb.W
		}
		if err := sink.ReadUpstream(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}
