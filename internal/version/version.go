// Package version holds what identifies a hotproxy build: its version
// string and the versions of the interfaces it shares with other builds.
package version

// Version is the build's version, set at link time:
//
//	go build -ldflags "-X github.com/hotproxy/hotproxy/internal/version.Version=v1.2.3"
var Version = "dev"

// The versions of what builds share — the hot-restart protocol and the
// stats region's layout — live with their code: hotrestart.ProtocolVersion
// and shm.LayoutMajor/LayoutMinor.
