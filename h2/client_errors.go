package h2

import (
	"errors"
	"fmt"

	"golang.org/x/net/http2"
)

// Errors of the client side. Test them with errors.Is; IsRetrySafe says
// whether a failed request may be sent again on another connection.
var (
	// ErrRefused marks a stream the peer never processed: refused before
	// it was opened (connection going away, at the peer's
	// MAX_CONCURRENT_STREAMS, stream ids exhausted, connection closed),
	// above the last-stream-id of a GOAWAY, or reset with REFUSED_STREAM
	// before any response. Retrying it on another connection is safe
	// (RFC 9113 §8.7), provided the caller still holds the request body.
	ErrRefused = errors.New("h2 client: stream refused before the peer processed it (safe to retry on another connection)")
	// ErrClientConnClosed: the connection is closed (Close, Shutdown
	// completed, idle timeout, or the peer went away).
	ErrClientConnClosed = errors.New("h2 client: connection closed")
	// ErrMalformedResponse: the peer's response broke RFC 9113 §8.1.1 or
	// §8.3 (pseudo-headers, connection-specific fields, content-length
	// against DATA, trailers without END_STREAM, headers over our
	// limit). The stream is reset with PROTOCOL_ERROR and nothing of it
	// may be forwarded.
	ErrMalformedResponse = errors.New("h2 client: malformed response")
	// ErrInvalidRequestHead: the RequestHead cannot be sent as HTTP/2
	// (upper-case or connection-specific field names, CR/LF/NUL in a
	// value, too large for the peer's SETTINGS_MAX_HEADER_LIST_SIZE).
	// Nothing was sent; the caller must fix the head, not retry it.
	ErrInvalidRequestHead = errors.New("h2 client: invalid request head")
	// ErrPingTimeout: a health PING stayed unanswered for PingTimeout.
	ErrPingTimeout = errors.New("h2 client: ping unanswered, connection declared dead")
	// ErrSendClosed: Write, WriteTrailers or CloseSend after the request
	// side was already ended.
	ErrSendClosed = errors.New("h2 client: request body already ended")
)

// IsRetrySafe reports whether err says the peer never processed the
// request, so that it may be sent again on another connection.
func IsRetrySafe(err error) bool { return errors.Is(err, ErrRefused) }

// ClientRefusedError says why a stream was refused; it matches ErrRefused.
type ClientRefusedError struct {
	StreamID uint32 // 0 when refused before an id was taken
	Reason   string
}

func (e *ClientRefusedError) Error() string {
	if e.StreamID == 0 {
		return "h2 client: new stream refused: " + e.Reason + " (safe to retry on another connection)"
	}
	return fmt.Sprintf("h2 client: stream %d refused: %s (safe to retry on another connection)", e.StreamID, e.Reason)
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *ClientRefusedError) Is(target error) bool { return target == ErrRefused }

// ClientStreamError is a stream ended by RST_STREAM, sent by the peer (Remote)
// or by us (a malformed response, a flow-control violation, Reset).
type ClientStreamError struct {
	StreamID uint32
	Code     http2.ErrCode
	Remote   bool
	Cause    error // why we reset it; nil when Remote
}

func (e *ClientStreamError) Error() string {
	who := "we reset"
	if e.Remote {
		who = "peer reset"
	}
	if e.Cause != nil {
		return fmt.Sprintf("h2 client: stream %d: %s it with %v: %v", e.StreamID, who, e.Code, e.Cause)
	}
	return fmt.Sprintf("h2 client: stream %d: %s it with %v", e.StreamID, who, e.Code)
}

func (e *ClientStreamError) Unwrap() error { return e.Cause }

// ClientConnError is the reason a connection died of a protocol error: the
// GOAWAY code we sent (or received) and what happened.
type ClientConnError struct {
	Code   http2.ErrCode
	Remote bool // the peer sent GOAWAY with this code and closed
	Reason string
}

func (e *ClientConnError) Error() string {
	if e.Remote {
		return fmt.Sprintf("h2 client: peer closed the connection with %v: %s", e.Code, e.Reason)
	}
	return fmt.Sprintf("h2 client: connection error %v: %s", e.Code, e.Reason)
}
