package config

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

var (
	lbPolicies = []string{LBRoundRobin, LBLeastRequest, LBRandom, LBRingHash, LBMaglev}
	balances   = []string{BalanceLeastConn, BalanceHash, BalanceKernel}
	logLevels  = []string{"trace", "debug", "info", "warn", "error"}
	logFormats = []string{"text", "json"}
	protocols  = []string{ProtocolHTTP, ProtocolTCP}
)

// Validate checks c as a whole, defaults already filled in (Parse does
// both), and returns an *Error listing every problem, or nil.
func (c *Config) Validate() error {
	v := validator{c: c, outOfBounds: map[string]bool{}}
	v.bounds(reflect.ValueOf(c).Elem(), rootSchema(), "", nil)
	v.server()
	v.admin()
	v.log()
	v.hotRestart()
	v.stats()
	v.overload()
	v.listeners()
	v.clusters()
	v.xds()
	return v.ps.err(c.Source)
}

type validator struct {
	c  *Config
	ps problems
	// addrs maps each listener's normalized address to its key.
	addrs map[string]string
	// outOfBounds has the keys whose value is outside their bound (the
	// problem is reported), so that rules relating them to other keys
	// say nothing more.
	outOfBounds map[string]bool
}

// inBounds reports whether key's value is within its bound.
func (v *validator) inBounds(key string) bool { return !v.outOfBounds[key] }

func (v *validator) server() {
	s := v.c.Server
	if v.inBounds("server.parent_shutdown_time") && v.inBounds("server.drain_time") && s.ParentShutdownTime < s.DrainTime {
		v.ps.add("server.parent_shutdown_time", "%q: must be at least drain_time (%q): a draining generation exits at parent_shutdown_time, which would cut off requests that drain_time still gives time to finish; raise parent_shutdown_time or lower drain_time",
			durationString(s.ParentShutdownTime), durationString(s.DrainTime))
	}
}

func (v *validator) admin() {
	a := v.c.Admin.Address
	if msg := checkAddress(a, true, 0); msg != "" {
		v.ps.add("admin.address", "%s", msg)
		return
	}
	if !v.c.Admin.AllowRemote && !v.c.Admin.Loopback() {
		v.ps.add("admin.address", "%s: not a loopback address, and the admin API has no authentication and can drain and stop the proxy; bind it to 127.0.0.1 or [::1] (default %q), or set [admin] allow_remote = true to expose it on purpose (and firewall it)", quote(a), DefaultAdminAddress)
		return
	}
	// The admin listener must not collide with a proxy listener.
	n := normAddress(a)
	for i, l := range v.c.Listeners {
		if n != "" && checkAddress(l.Address, true, 0) == "" && normAddress(l.Address) == n {
			v.ps.add("admin.address", "%s: %s listens there already; give the admin API an address of its own", quote(a), itemKey("listeners", i, l.Name))
			return
		}
	}
}

func (v *validator) hotRestart() {
	h := v.c.HotRestart
	if h.SocketDir != "" && !filepath.IsAbs(h.SocketDir) {
		v.ps.add("hot_restart.socket_dir", "%s: must be an absolute path (a relative one would depend on the directory each generation starts in)", quote(h.SocketDir))
	}
}

func (v *validator) stats() {
	st := v.c.Stats
	if st.Path != "" && !filepath.IsAbs(st.Path) {
		v.ps.add("stats.path", "%s: must be an absolute path (every generation must find the same region, whatever directory it starts in)", quote(st.Path))
	}
	if m, err := parseFileMode(st.FileMode); err != nil {
		v.ps.add("stats.file_mode", "%s: %v", quote(st.FileMode), err)
	} else if m&0o022 != 0 {
		// Whoever can write the region can truncate it under every
		// generation or corrupt its stats; the region refuses such a file.
		v.ps.add("stats.file_mode", "%s: writable by group or others, who could truncate or corrupt the stats region (write it like \"0640\" so the group may read it, or \"0600\")", quote(st.FileMode))
	}
}

func (v *validator) log() {
	l := v.c.Log
	if !slices.Contains(logLevels, l.Level) {
		v.ps.add("log.level", "%s: unknown level (use %s)", quote(l.Level), orList(logLevels))
	}
	if !slices.Contains(logFormats, l.Format) {
		v.ps.add("log.format", "%s: unknown format (use %s)", quote(l.Format), orList(logFormats))
	}
	if l.Path != "" && !filepath.IsAbs(l.Path) {
		v.ps.add("log.path", "%s: must be an absolute path (the supervisor and every generation must open the same file, whatever directory they start in)", quote(l.Path))
	}
}

// name checks a listener's or cluster's name, and that it is unique;
// seen maps the names so far to their keys.
func (v *validator) name(key, what, name string, seen map[string]string) {
	switch {
	case name == "":
		v.ps.add(key+".name", "missing: every %s needs a unique name", what)
		return
	case !validName(name):
		v.ps.add(key+".name", "%s: invalid name (use letters, digits, '_', '-' and '.': names appear in stats and logs)", quote(name))
	}
	if other, ok := seen[name]; ok {
		v.ps.add(key+".name", "%s: duplicate name (%s has it too); %s names must be unique", quote(name), other, what)
		return
	}
	seen[name] = key
}

// itemKey names an element of an array of tables: `listeners[0] ("web")`.
func itemKey(array string, i int, name string) string {
	k := fmt.Sprintf("%s[%d]", array, i)
	if name != "" {
		k += " (" + quote(name) + ")"
	}
	return k
}

func validName(s string) bool {
	if len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// orList writes "a, b or c".
func orList(l []string) string {
	if len(l) == 1 {
		return l[0]
	}
	return strings.Join(l[:len(l)-1], ", ") + " or " + l[len(l)-1]
}
