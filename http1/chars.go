package http1

// Byte classes, as tables so the hot loops are one load per byte.
var (
	isTchar      [256]bool // RFC 9110 tchar
	isFieldVchar [256]bool // a byte allowed inside a field value: HTAB, SP, VCHAR, obs-text
	isTargetChar [256]bool // a byte allowed in a request target, '%' checked apart
	isRegName    [256]bool // a byte allowed in a host name (strict subset of reg-name)
	isHex        [256]bool
)

func init() {
	for c := 0; c < 256; c++ {
		b := byte(c)
		alnum := 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
		switch {
		case alnum:
			isTchar[c] = true
		case b == '!' || b == '#' || b == '$' || b == '%' || b == '&' || b == '\'' || b == '*' ||
			b == '+' || b == '-' || b == '.' || b == '^' || b == '_' || b == '`' || b == '|' || b == '~':
			isTchar[c] = true
		}
		isFieldVchar[c] = b == '\t' || b == ' ' || (0x21 <= b && b <= 0x7e) || b >= 0x80
		// Visible ASCII except '#' (a fragment is never sent, RFC 9112 §3.2)
		// and '\' (some servers read it as '/', which would let a path
		// escape the prefix a route matched).
		isTargetChar[c] = 0x21 <= b && b <= 0x7e && b != '#' && b != '\\'
		isRegName[c] = alnum || b == '-' || b == '.' || b == '_' || b == '~'
		isHex[c] = '0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
	}
}

func isOWS(b byte) bool { return b == ' ' || b == '\t' }

// trimOWS returns the bounds of b[start:end] without leading and trailing SP/HTAB.
func trimOWS(b []byte, start, end int) (int, int) {
	for start < end && isOWS(b[start]) {
		start++
	}
	for end > start && isOWS(b[end-1]) {
		end--
	}
	return start, end
}

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTchar[c] {
			return false
		}
	}
	return true
}

// EqualFoldBytes is EqualFold for two byte slices (ASCII case only).
func EqualFoldBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// validAuthority reports whether b is host[:port] with a host name of
// reg-name characters in labels that are not empty (no percent-encoding,
// no userinfo; one trailing dot allowed), an IPv4 address
// (which is also a reg-name) or a bracketed IPv6 address, and a port of 1-5
// digits. needPort requires the port (CONNECT's authority-form).
func validAuthority(b []byte, needPort bool) bool {
	if len(b) == 0 {
		return false
	}
	var rest []byte
	if b[0] == '[' {
		end := -1
		for i := 1; i < len(b); i++ {
			if b[i] == ']' {
				end = i
				break
			}
		}
		if end < 0 || !validIPv6(b[1:end]) {
			return false
		}
		rest = b[end+1:]
	} else {
		i := 0
		for i < len(b) && isRegName[b[i]] {
			// No empty label: "a..b" and ".a" are no names a
			// resolver or a route knows, and a single trailing dot
			// ("a.", the absolute form of "a") is the only one.
			if b[i] == '.' && (i == 0 || b[i-1] == '.') {
				return false
			}
			i++
		}
		if i == 0 {
			return false
		}
		rest = b[i:]
	}
	if len(rest) == 0 {
		return !needPort
	}
	if rest[0] != ':' || len(rest) < 2 || len(rest) > 6 {
		return false
	}
	for _, c := range rest[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// validIPv6 reports whether b is an IPv6 address (RFC 4291 text form, no
// zone), optionally ending in a dotted IPv4 address; as strict as
// net/netip, which is what a Go backend would check it with.
func validIPv6(b []byte) bool {
	groups := 0
	ellipsis := false
	i := 0
	if len(b) >= 2 && b[0] == ':' && b[1] == ':' {
		ellipsis = true
		i = 2
		if i == len(b) {
			return true
		}
	}
	for i < len(b) {
		// One group: 1-4 hex digits, or a trailing IPv4 address.
		j := i
		for j < len(b) && j-i < 5 && isHex[b[j]] {
			j++
		}
		if j < len(b) && b[j] == '.' {
			if groups > 6 || !validIPv4(b[i:]) {
				return false
			}
			groups += 2
			i = len(b)
			break
		}
		if j == i || j-i > 4 {
			return false
		}
		groups++
		i = j
		if i == len(b) {
			break
		}
		if b[i] != ':' || i+1 == len(b) {
			return false
		}
		i++
		if b[i] == ':' {
			if ellipsis {
				return false
			}
			ellipsis = true
			i++
			if i == len(b) {
				break
			}
		}
		if groups > 8 {
			return false
		}
	}
	if ellipsis {
		return groups < 8
	}
	return groups == 8
}

// validIPv4 reports whether b is a dotted-decimal IPv4 address without
// leading zeros.
func validIPv4(b []byte) bool {
	octets := 0
	i := 0
	for {
		j := i
		v := 0
		for j < len(b) && j-i < 4 && '0' <= b[j] && b[j] <= '9' {
			v = v*10 + int(b[j]-'0')
			j++
		}
		n := j - i
		if n == 0 || n > 3 || v > 255 || (n > 1 && b[i] == '0') {
			return false
		}
		octets++
		if j == len(b) {
			return octets == 4
		}
		if b[j] != '.' || octets == 4 {
			return false
		}
		i = j + 1
	}
}
