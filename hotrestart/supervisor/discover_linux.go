package supervisor

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hotproxy/hotproxy/hotrestart"
)

// runningEpoch finds the newest generation of baseID that listens for a
// successor, from its restart socket: in dir when dir is set, else among
// the abstract sockets of this network namespace (/proc/net/unix), which is
// how a supervisor in another container of the pod finds it. ok is false
// when none listens.
func runningEpoch(baseID int, dir string) (epoch int, ok bool) {
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
	epoch = -1
	for _, n := range names {
		rest, found := strings.CutPrefix(n, prefix)
		if !found {
			continue
		}
		e, err := strconv.Atoi(strings.TrimSuffix(rest, suffix))
		if err == nil && e > epoch {
			epoch = e
		}
	}
	return epoch, epoch >= 0
}
