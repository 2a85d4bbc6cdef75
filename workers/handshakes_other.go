//go:build !linux

package workers

import "github.com/hashicorp/go-hclog"

// handshakesPending: without the kernel's socket diagnostics (or its
// /proc/net/tcp), none are known.
func handshakesPending(int, hclog.Logger) bool { return false }
