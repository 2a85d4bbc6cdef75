package http1

// CheckRequestParts checks the parts of a request that did not arrive in
// a request line and a Host field — HTTP/2's :method, :path and
// :authority (or its Host field) — by the rules Parse holds an HTTP/1.1
// request line and Host to, so that a request gets the same answer
// whichever protocol carried it. A proxy that checked them less would
// write a method or path with a space in it into the request line it
// sends an HTTP/1.1 upstream ("GET /private HTTP/1.1 /public" routed as
// /public), or hand on a '\' that the HTTP/1.1 parser refuses.
//
// method must be a token; target origin-form ("/...") or, for OPTIONS
// only, "*" (what :path may hold, RFC 9113 §8.3.1), of the characters a
// request target may hold, with valid percent-encoding in its path; host
// a valid host[:port], never empty (RFC 9113 §8.3.1: an http or https
// request has an :authority or a Host). CONNECT is the caller's: it has
// no path. A method and target longer together than the request line
// lim.MaxRequestLine allows are a 414, as over HTTP/1.1: the upstream's
// request line would be that long. It returns nil or the *Error Parse
// answers the same fault with (400, 414), and does not allocate.
func CheckRequestParts(method, target, host []byte, lim Limits) error {
	if code := checkRequestParts(method, target, host, lim.withDefaults()); code != errNone {
		return code.request()
	}
	return nil
}

func checkRequestParts(method, target, host []byte, lim Limits) errCode {
	if len(method)+1+len(target)+len(" HTTP/1.1") > lim.MaxRequestLine {
		return errRequestLineTooLong
	}
	if !isToken(method) {
		return errBadMethod
	}
	if len(target) == 0 {
		return errBadRequestLine
	}
	if code := checkTarget(target); code != errNone {
		return code
	}
	switch {
	case target[0] == '/':
	case len(target) == 1 && target[0] == '*' && string(method) == "OPTIONS":
	default:
		return errTargetForm
	}
	switch {
	case len(host) == 0:
		return errNoAuthority
	case !validAuthority(host, false):
		return errBadHost
	}
	return errNone
}

// ValidHost reports whether host is a valid Host field value: host[:port]
// with a host name of non-empty labels of reg-name characters (one
// trailing dot allowed), an IPv4 address or a bracketed IPv6 address.
func ValidHost(host []byte) bool { return validAuthority(host, false) }
