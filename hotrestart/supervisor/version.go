package supervisor

import (
	"debug/buildinfo"
	"strings"
)

// versionVar is the variable a release build sets with -ldflags -X.
const versionVar = "github.com/hotproxy/hotproxy/internal/version.Version"

// BinaryVersion returns the version a hotproxy binary was built with,
// from its build information (the -X of -ldflags), without running it:
// "dev" for a build that did not set it, "" when path is not a Go binary.
func BinaryVersion(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key != "-ldflags" {
			continue
		}
		if v, ok := ldflagsVersion(s.Value); ok {
			return v
		}
	}
	return "dev"
}

// ldflagsVersion finds -X versionVar=V in an -ldflags string.
func ldflagsVersion(flags string) (string, bool) {
	fields := strings.Fields(flags)
	for i, f := range fields {
		var def string
		switch {
		case f == "-X" && i+1 < len(fields):
			def = fields[i+1]
		case strings.HasPrefix(f, "-X="):
			def = f[len("-X="):]
		default:
			continue
		}
		def = strings.Trim(def, `"'`)
		if v, ok := strings.CutPrefix(def, versionVar+"="); ok {
			return strings.Trim(v, `"'`), true
		}
	}
	return "", false
}
