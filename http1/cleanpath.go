package http1

// CleanPath appends to dst the path of a request target (origin-form: up to '?' or '#';
// absolute-form: after scheme://authority; authority and asterisk forms: empty ... or "*")
// normalised for route matching: percent-encoded unreserved characters decoded
// (RFC 3986 §6.2.2.2, so %2e is '.'), ';' parameters removed from each
// segment, duplicate slashes merged, dot segments resolved (RFC 3986 §5.2.4),
// never above the root; always starts with '/' for origin and absolute forms.
// "/x/../admin", "//admin", "/admin;x", "/x/%2e%2e/admin" all give "/admin". No allocation when dst has room.
//
// The point is that a route matches what the backend will serve: every
// spelling a common server resolves to "/admin" must clean to "/admin", or
// a deny rule on "/admin" is a suggestion. Encoded '/' (%2F) and other
// reserved characters stay encoded, since decoding them changes the path's
// structure. An empty target (never accepted by Request.Parse) gives nothing.
func CleanPath(dst, target []byte) []byte {
	var path []byte
	switch {
	case len(target) == 0:
		return dst
	case target[0] == '/':
		path = target
	case len(target) == 1 && target[0] == '*':
		return append(dst, '*')
	default:
		n := schemeLen(target)
		if n == 0 {
			return dst // authority-form: no path
		}
		rest := target[n:]
		i := 0
		for i < len(rest) && rest[i] != '/' && rest[i] != '?' && rest[i] != '#' {
			i++
		}
		path = rest[i:]
	}
	for i, c := range path {
		if c == '?' || c == '#' {
			path = path[:i]
			break
		}
	}

	base := len(dst)
	out := append(dst, '/')
	i := 0
	if len(path) > 0 && path[0] == '/' {
		i = 1
	}
	for i <= len(path) {
		j := i
		for j < len(path) && path[j] != '/' {
			j++
		}
		segStart := len(out)
		out = appendSegment(out, path[i:j])
		switch seg := out[segStart:]; {
		case len(seg) == 0:
			// An empty segment: a duplicate or trailing slash.
		case len(seg) == 1 && seg[0] == '.':
			out = out[:segStart]
		case len(seg) == 2 && seg[0] == '.' && seg[1] == '.':
			out = out[:segStart]
			if segStart-1 > base { // drop the previous segment, never the root
				k := segStart - 2
				for out[k] != '/' {
					k--
				}
				out = out[:k+1]
			}
		default:
			if j < len(path) {
				out = append(out, '/')
			}
		}
		i = j + 1
	}
	return out
}

// appendSegment appends one path segment with its ';' parameters removed
// and its percent-encoded unreserved characters decoded.
func appendSegment(out, seg []byte) []byte {
	for k := 0; k < len(seg); k++ {
		c := seg[k]
		if c == ';' {
			break
		}
		if c == '%' && k+2 < len(seg) && isHex[seg[k+1]] && isHex[seg[k+2]] {
			if d := unhex(seg[k+1])<<4 | unhex(seg[k+2]); isUnreserved(d) {
				out = append(out, d)
				k += 2
				continue
			}
		}
		out = append(out, c)
	}
	return out
}

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
