package accesslog

import (
	"strconv"
	"unicode/utf8"

	"github.com/hotproxy/hotproxy/config"
)

// format is a compiled access-log format: literal text and variables in
// turn, or JSON. It appends a line to a buffer without allocating.
type format struct {
	json     bool
	parts    []part
	listener string
	epoch    int
}

type part struct {
	lit string
	v   variable // 0: a literal
}

type variable uint8

const (
	varNone variable = iota
	varStartTime
	varClientIP
	varMethod
	varPath
	varProtocol
	varResponseCode
	varBytesReceived
	varBytesSent
	varDuration
	varUpstreamCluster
	varUpstreamHost
	varRetries
	varListener
	varEpoch
)

// variables maps config.AccessLogVariables to their codes; a test checks
// that every name there has one.
var variables = map[string]variable{
	"START_TIME":       varStartTime,
	"CLIENT_IP":        varClientIP,
	"METHOD":           varMethod,
	"PATH":             varPath,
	"PROTOCOL":         varProtocol,
	"RESPONSE_CODE":    varResponseCode,
	"BYTES_RECEIVED":   varBytesReceived,
	"BYTES_SENT":       varBytesSent,
	"DURATION":         varDuration,
	"UPSTREAM_CLUSTER": varUpstreamCluster,
	"UPSTREAM_HOST":    varUpstreamHost,
	"RETRIES":          varRetries,
	"LISTENER":         varListener,
	"EPOCH":            varEpoch,
}

func compile(f, listener string, epoch int) (*format, error) {
	fm := &format{listener: listener, epoch: epoch}
	if f == config.AccessLogJSON {
		fm.json = true
		return fm, nil
	}
	parts, err := config.AccessLogFormatVariables(f)
	if err != nil {
		return nil, err
	}
	for i, p := range parts {
		if i%2 == 0 {
			if p != "" {
				fm.parts = append(fm.parts, part{lit: p})
			}
			continue
		}
		fm.parts = append(fm.parts, part{v: variables[p]})
	}
	return fm, nil
}

// append appends r's line, newline included.
func (f *format) append(b []byte, r *Record) []byte {
	if f.json {
		b = append(b, '{')
		for i, name := range config.AccessLogVariables {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = append(b, name...)
			b = append(b, `":`...)
			b = f.appendVar(b, variables[name], r, true)
		}
		return append(b, "}\n"...)
	}
	for _, p := range f.parts {
		if p.v == varNone {
			b = append(b, p.lit...)
		} else {
			b = f.appendVar(b, p.v, r, false)
		}
	}
	return append(b, '\n')
}

// appendVar appends one variable: in JSON, strings quoted and numbers
// bare; in text, "-" for an empty value.
func (f *format) appendVar(b []byte, v variable, r *Record, json bool) []byte {
	str := func(b []byte, s []byte) []byte {
		if json {
			return appendJSONString(b, s)
		}
		if len(s) == 0 {
			return append(b, '-')
		}
		return appendEscaped(b, s)
	}
	switch v {
	case varStartTime:
		if json {
			b = append(b, '"')
		}
		b = r.Start.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
		if json {
			b = append(b, '"')
		}
		return b
	case varClientIP:
		return str(b, r.ClientIP())
	case varMethod:
		return str(b, r.Method())
	case varPath:
		return str(b, r.Path())
	case varProtocol:
		p := "HTTP/1.1"
		switch {
		case r.HTTP2:
			p = "HTTP/2.0"
		case r.Minor == 0:
			p = "HTTP/1.0"
		}
		return str(b, []byte(p))
	case varResponseCode:
		return strconv.AppendUint(b, uint64(r.Status), 10)
	case varBytesReceived:
		return strconv.AppendInt(b, r.BytesReceived, 10)
	case varBytesSent:
		return strconv.AppendInt(b, r.BytesSent, 10)
	case varDuration:
		// Milliseconds to the microsecond: a request answered locally
		// takes well under one, and whole milliseconds logged 0.
		return strconv.AppendFloat(b, float64(r.Duration.Microseconds())/1000, 'f', 3, 64)
	case varUpstreamCluster:
		return str(b, []byte(r.Cluster))
	case varUpstreamHost:
		return str(b, []byte(r.Upstream))
	case varRetries:
		return strconv.AppendUint(b, uint64(r.Retries), 10)
	case varListener:
		return str(b, []byte(f.listener))
	case varEpoch:
		return strconv.AppendInt(b, int64(f.epoch), 10)
	}
	return b
}

const hexDigits = "0123456789abcdef"

// appendEscaped writes s for a text line: bytes outside printable ASCII,
// '"' and '\' as \xHH, so a line is always one line and a field cannot
// forge another.
func appendEscaped(b, s []byte) []byte {
	for _, c := range s {
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			b = append(b, '\\', 'x', hexDigits[c>>4], hexDigits[c&15])
			continue
		}
		b = append(b, c)
	}
	return b
}

// appendJSONString writes s as a JSON string; bytes that are not valid
// UTF-8 become U+FFFD.
func appendJSONString(b, s []byte) []byte {
	b = append(b, '"')
	for len(s) > 0 {
		c := s[0]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == 0x7f:
				b = append(b, `\u00`...)
				b = append(b, hexDigits[c>>4], hexDigits[c&15])
			default:
				b = append(b, c)
			}
			s = s[1:]
			continue
		}
		r, n := utf8.DecodeRune(s)
		if r == utf8.RuneError && n == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[:n]...)
		}
		s = s[n:]
	}
	return append(b, '"')
}
