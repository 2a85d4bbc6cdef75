package config

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// Checks of the keys that shape how a request is routed and recorded:
// retries and timeouts of a route, the hash key of a cluster, access logs.

// retries checks a route's timeout and retry keys; requestTimeout is the
// listener's, which a route's timeout replaces. Both timeouts are 0 when
// left out: the listener's request_timeout bounds the request, and each
// try has no bound of its own.
func (v *validator) retries(key string, r *Route, requestTimeout Duration) {
	retrySet := len(r.RetryOn) > 0 || r.NumRetries != nil || r.PerTryTimeout != 0 || r.RetryNonIdempotent || r.Timeout != 0
	if !r.ProxiesToCluster() && retrySet {
		v.ps.add(key, "timeout and retry keys apply to a route with a cluster, not to a direct_response; remove them")
		return
	}
	if !r.ProxiesToCluster() {
		return
	}
	for i, c := range r.RetryOn {
		if !slices.Contains(RetryConditions, c) {
			msg := fmt.Sprintf("%s: unknown condition (use %s)", quote(c), orList(RetryConditions))
			if s := closest(c, RetryConditions); s != "" {
				msg = fmt.Sprintf("%s: unknown condition (did you mean %s?)", quote(c), quote(s))
			}
			v.ps.add(fmt.Sprintf("%s.retry_on[%d]", key, i), "%s", msg)
		}
	}
	if v.inBounds(key+".num_retries") && r.NumRetries != nil && *r.NumRetries > 0 && len(r.RetryOn) == 0 {
		v.ps.add(key+".num_retries", "%d: does nothing without retry_on; add retry_on = [\"connect-failure\", \"5xx\"] or remove num_retries", *r.NumRetries)
	}
	timeout := r.Timeout
	if timeout == 0 {
		timeout = requestTimeout
	}
	if r.PerTryTimeout != 0 && v.inBounds(key+".per_try_timeout") && r.PerTryTimeout > timeout {
		v.ps.add(key+".per_try_timeout", "%q: longer than the route's timeout (%q), which bounds every try together; lower per_try_timeout or raise timeout",
			durationString(r.PerTryTimeout), durationString(timeout))
	}
	if r.RetryNonIdempotent && len(r.RetryOn) == 0 {
		v.ps.add(key+".retry_non_idempotent", "does nothing without retry_on; add retry_on or remove it")
	}
}

// hashOn checks a cluster's hash_on against its lb_policy.
func (v *validator) hashOn(key string, c *Cluster) {
	hashing := c.LBPolicy == LBRingHash || c.LBPolicy == LBMaglev
	switch {
	case hashing && c.HashOn == "":
		v.ps.add(key+".hash_on", "missing: lb_policy %s needs a key, like hash_on = \"header:x-user\", \"cookie:session\" or \"source_ip\"", quote(c.LBPolicy))
	case !hashing && c.HashOn != "":
		v.ps.add(key+".hash_on", "%s: applies to lb_policy %s or %s only; remove it or change lb_policy", quote(c.HashOn), quote(LBRingHash), quote(LBMaglev))
	case c.HashOn == "" || c.HashOn == HashOnSourceIP:
	case strings.HasPrefix(c.HashOn, HashOnHeaderPrefix), strings.HasPrefix(c.HashOn, HashOnCookiePrefix):
		_, name, _ := strings.Cut(c.HashOn, ":")
		if name == "" || !isToken(name) {
			v.ps.add(key+".hash_on", "%s: the name after %q must be a header or cookie name (letters, digits, '-', '_')", quote(c.HashOn), c.HashOn[:strings.IndexByte(c.HashOn, ':')+1])
		}
	default:
		v.ps.add(key+".hash_on", "%s: unknown key (write \"header:NAME\", \"cookie:NAME\" or \"source_ip\")", quote(c.HashOn))
	}
}

func isToken(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// accessLog checks one access log of an http listener.
func (v *validator) accessLog(key string, a *AccessLog) {
	if a.Path == "" {
		v.ps.add(key+".path", "missing: the file to append lines to, like path = \"/var/log/hotproxy/access.log\"")
	} else if !filepath.IsAbs(a.Path) {
		v.ps.add(key+".path", "%s: must be an absolute path (the process may run from any directory)", quote(a.Path))
	}
	if a.Format != AccessLogJSON {
		if _, err := AccessLogFormatVariables(a.Format); err != nil {
			v.ps.add(key+".format", "%s", err.Error())
		}
	}
}

// AccessLogFormatVariables splits an access-log format string into its
// literal text and variables: parts alternate literal, variable,
// literal, ... (the variables at odd indices). An unknown %NAME% or an
// unclosed % is an error that names it; "%%" is a literal "%".
func AccessLogFormatVariables(format string) ([]string, error) {
	if format == "" {
		return nil, fmt.Errorf("empty: write \"json\" or a format string like %q", DefaultAccessLogFormat)
	}
	var parts []string
	var lit strings.Builder
	for s := format; s != ""; {
		i := strings.IndexByte(s, '%')
		if i < 0 {
			lit.WriteString(s)
			break
		}
		lit.WriteString(s[:i])
		s = s[i+1:]
		if strings.HasPrefix(s, "%") {
			lit.WriteByte('%')
			s = s[1:]
			continue
		}
		j := strings.IndexByte(s, '%')
		if j < 0 {
			return nil, fmt.Errorf("%s: a %% is not closed (write %%NAME%%, or %%%% for a literal %%)", quote(format))
		}
		name := s[:j]
		if !slices.Contains(AccessLogVariables, name) {
			msg := fmt.Sprintf("%s: unknown variable %%%s%% (variables: %s)", quote(format), name, strings.Join(AccessLogVariables, ", "))
			if c := closest(name, AccessLogVariables); c != "" {
				msg = fmt.Sprintf("%s: unknown variable %%%s%% (did you mean %%%s%%?)", quote(format), name, c)
			}
			return nil, fmt.Errorf("%s", msg)
		}
		parts = append(parts, lit.String(), name)
		lit.Reset()
		s = s[j+1:]
	}
	parts = append(parts, lit.String())
	return parts, nil
}
