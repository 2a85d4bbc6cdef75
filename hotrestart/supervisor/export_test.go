package supervisor

// ParseRequestForTest exposes parseRequest to the external tests.
func ParseRequestForTest(b []byte) (Request, error) { return parseRequest(b) }
