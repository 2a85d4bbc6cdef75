// Package http1 is hotproxy's HTTP/1.1 codec for the data path: it parses
// request and response heads in place into fixed arrays of spans, decodes
// and encodes the chunked transfer coding, and normalises request paths for
// route matching, without allocating.
//
// It is attack surface. A proxy and the server behind it that disagree on
// where a message ends can be made to see two requests where the proxy saw
// one (request smuggling), so every framing rule of RFC 9112 that two
// implementations could read differently is enforced strictly, and whatever
// is ambiguous is rejected rather than repaired:
//
//   - lines end in CRLF only; a bare CR or LF anywhere in a head, an empty
//     line before the request line, and obs-fold (a field line starting with
//     SP or HTAB) are rejected, because other parsers treat each of them
//     differently;
//   - a field name must be a token directly followed by ':' (whitespace
//     before the colon once let "Transfer-Encoding :" hide from a proxy);
//     field values may hold no control characters but HTAB;
//   - Content-Length must be plain digits that fit in 63 bits; several
//     Content-Length values must be identical;
//   - Transfer-Encoding is accepted only as exactly one field "chunked",
//     never in HTTP/1.0, never together with Content-Length;
//   - an HTTP/1.1 request needs exactly one valid Host, equal to the
//     authority of an absolute-form target;
//   - the request target must be of the form its method allows (origin,
//     absolute, authority only for CONNECT, "*" only for OPTIONS), of
//     visible ASCII with valid percent-encoding in its path, no fragment
//     and no backslash (which some servers read as '/');
//   - a CONNECT request may carry no body: what follows its head is the
//     tunnel;
//   - chunk sizes are 1 to 15 hex digits and nothing else, chunk data must be
//     followed by exactly CRLF, chunk extensions must be well formed, and a
//     trailer may not carry framing or connection fields (Content-Length,
//     Transfer-Encoding, Host, Connection and the like), since it is
//     forwarded as is and some backends merge it into the header section.
//
// Request errors carry the status a server answers (400, 414, 431, 505);
// response errors carry 502. The differential fuzz tests check that
// whatever this package accepts, net/http accepts too and reads the same way.
package http1
