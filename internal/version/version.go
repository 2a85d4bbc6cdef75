// Package version holds what identifies a hotproxy build: its version
// string and the versions of the interfaces it shares with other builds.
package version

// Version is the build's version, set at link time:
//
//	go build -ldflags "-X github.com/hotproxy/hotproxy/internal/version.Version=v1.2.3"
var Version = "dev"

// HotRestartProtocol is the version of the protocol spoken between
// generations. Builds with equal major versions hot restart into each other.
const HotRestartProtocol = "1.0"
