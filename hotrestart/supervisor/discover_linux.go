package supervisor

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/unixsock"
)

// runningEpoch finds the newest generation of baseID that listens for a
// successor, from its restart socket: in dir when dir is set, else among
// the abstract sockets of this network namespace (/proc/net/unix), which is
// how a supervisor in another container of the pod finds it. ok is false
// when none listens.
//
// A name is only a claim: anyone may bind an abstract one. So each
// candidate's listener must run as this user or root (its pid may be 0, a
// process in a pid namespace this one cannot see); one of another user is
// skipped with a warning, or it could pick the epoch (a squatter on
// @hotproxy.B.999) and leave the real generation serving beside a cold
// start. A generation on an alternate name (hotrestart.Addresses) counts
// for its epoch.
func runningEpoch(baseID int, dir string, log hclog.Logger) (epoch int, ok bool) {
	prefix := hotrestart.Address(baseID, 0, dir)
	prefix = prefix[:len(prefix)-len("0")]
	suffix := ""
	var names []string
	if dir != "" {
		prefix = strings.TrimSuffix(hotrestart.Address(baseID, 0, dir), "0.sock")
		suffix = ".sock"
		matches, _ := filepath.Glob(prefix + "*" + suffix)
		names = matches
	} else {
		f, err := os.Open("/proc/net/unix")
		if err != nil {
			return 0, false
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// Num RefCount Protocol Flags Type St Inode Path; Flags
			// 00010000 is a listening socket.
			if len(fields) == 8 && fields[3] == "00010000" {
				names = append(names, fields[7])
			}
		}
	}
	type candidate struct {
		epoch int
		name  string
	}
	var found []candidate
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, prefix)
		if !ok {
			continue
		}
		if e, ok := epochOfName(strings.TrimSuffix(rest, suffix)); ok {
			found = append(found, candidate{e, n})
		}
	}
	slices.SortFunc(found, func(a, b candidate) int { return cmp.Compare(b.epoch, a.epoch) })
	self := os.Geteuid()
	for _, c := range found {
		uid, pid, err := unixsock.Holder("unixpacket", c.name, time.Second)
		if err != nil {
			continue // gone since, or not a restart socket
		}
		if uid != self && uid != 0 {
			log.Warn(fmt.Sprintf("restart socket %s is held by another user (uid %d, pid %d): not a generation to take over from; skipped", c.name, uid, pid),
				"restart_socket", c.name, "holder_uid", uid, "holder_pid", pid)
			continue
		}
		return c.epoch, true
	}
	return -1, false
}

// epochOfName reads the epoch of a restart socket's name after its
// base-id prefix: "E", or "E.K" for one of its alternates.
func epochOfName(rest string) (int, bool) {
	e, alt, isAlt := strings.Cut(rest, ".")
	epoch, err := strconv.Atoi(e)
	if err != nil || epoch < 0 {
		return 0, false
	}
	if isAlt {
		k, err := strconv.Atoi(alt)
		if err != nil || k < 1 || k > hotrestart.MaxAlternates {
			return 0, false
		}
	}
	return epoch, true
}
