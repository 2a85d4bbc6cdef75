package http1

// errCode names one way a head can be rejected. The parsers work in codes
// and Request.Parse / Response.Parse turn a code into one of two
// package-level *Error values, so that no error path allocates and the
// same rule answers 400 to a client and 502 for an upstream.
type errCode uint8

const (
	errNone errCode = iota
	errIncomplete
	errBareLF
	errBareCR
	errLeadingEmptyLine
	errRequestLineTooLong
	errHeadTooLarge
	errTooManyFields
	errBadRequestLine
	errBadMethod
	errBadTarget
	errTargetForm
	errBadPercent
	errBadVersion
	errVersionNotSupported
	errBadStatusLine
	errBadStatus
	errObsFold
	errEmptyFieldName
	errBadFieldName
	errSpaceBeforeColon
	errNoColon
	errBadFieldValue
	errBadContentLength
	errContentLengthMismatch
	errBadTransferEncoding
	errSeveralTransferEncodings
	errTransferEncodingHTTP10
	errLengthAndChunked
	errNoHost
	errSeveralHosts
	errBadHost
	errHostMismatch
	errBadConnection
	errBadUpgrade
	errSeveralUpgrades
	errBadTrailerField
	errConnectWithBody
	errNoAuthority
	numErrCodes
)

// errText is each code's status for a request and its reason.
var errText = [numErrCodes]struct {
	status int
	reason string
}{
	errBareLF:                   {400, "bare LF in head (lines must end in CRLF)"},
	errBareCR:                   {400, "bare CR in head"},
	errLeadingEmptyLine:         {400, "empty line before the start line"},
	errRequestLineTooLong:       {414, "request line too long"},
	errHeadTooLarge:             {431, "head too large"},
	errTooManyFields:            {431, "too many header fields"},
	errBadRequestLine:           {400, "malformed request line"},
	errBadMethod:                {400, "method is not a token"},
	errBadTarget:                {400, "invalid character in request target"},
	errTargetForm:               {400, "request target form not allowed for this method"},
	errBadPercent:               {400, "invalid percent-encoding in request target"},
	errBadVersion:               {400, "malformed HTTP version"},
	errVersionNotSupported:      {505, "HTTP version not supported"},
	errBadStatusLine:            {400, "malformed status line"},
	errBadStatus:                {400, "status code out of range 100-599"},
	errObsFold:                  {400, "obs-fold in header field"},
	errEmptyFieldName:           {400, "empty header field name"},
	errBadFieldName:             {400, "invalid character in header field name"},
	errSpaceBeforeColon:         {400, "whitespace between header field name and colon"},
	errNoColon:                  {400, "header field line without colon"},
	errBadFieldValue:            {400, "invalid character in header field value"},
	errBadContentLength:         {400, "invalid Content-Length"},
	errContentLengthMismatch:    {400, "several differing Content-Length values"},
	errBadTransferEncoding:      {400, "Transfer-Encoding other than chunked"},
	errSeveralTransferEncodings: {400, "several Transfer-Encoding fields"},
	errTransferEncodingHTTP10:   {400, "Transfer-Encoding in an HTTP/1.0 message"},
	errLengthAndChunked:         {400, "both Content-Length and Transfer-Encoding"},
	errNoHost:                   {400, "missing Host in an HTTP/1.1 request"},
	errSeveralHosts:             {400, "several Host fields"},
	errBadHost:                  {400, "invalid Host"},
	errHostMismatch:             {400, "Host differs from the authority of the request target"},
	errBadConnection:            {400, "invalid Connection"},
	errBadUpgrade:               {400, "invalid Upgrade"},
	errSeveralUpgrades:          {400, "several Upgrade fields"},
	errBadTrailerField:          {400, "Trailer names a field not allowed in a trailer or is not a list of field names"},
	errConnectWithBody:          {400, "CONNECT with a body"},
	errNoAuthority:              {400, "missing :authority and Host"},
}

// requestErrors and responseErrors hold one *Error per code: the status a
// server answers for a request, and 502 for a response.
var requestErrors, responseErrors [numErrCodes]Error

func init() {
	for code, t := range errText {
		requestErrors[code] = Error{Status: t.status, Reason: t.reason}
		responseErrors[code] = Error{Status: 502, Reason: "upstream response: " + t.reason}
	}
}

func (c errCode) request() error {
	if c == errIncomplete {
		return ErrIncomplete
	}
	return &requestErrors[c]
}

func (c errCode) response() error {
	if c == errIncomplete {
		return ErrIncomplete
	}
	return &responseErrors[c]
}
