package resmon

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CgroupMemory reads the memory usage and limit of the cgroup this process
// runs in, cgroup v2 or the v1 memory controller. In a container (a cgroup
// namespace) that is the container's cgroup.
type CgroupMemory struct {
	// Version is 1 or 2.
	Version int
	// Dir is the cgroup's directory; in v2, dirs are it and its
	// ancestors up to the mount's root, whose memory.max all bound it.
	Dir  string
	dirs []string
}

// unlimited: a v1 limit at or above this is no limit (the kernel writes
// PAGE_COUNTER_MAX pages, about 2^63 bytes).
const unlimited = 1 << 62

// FindCgroupMemory locates this process's memory cgroup from
// /proc/self/cgroup and /proc/self/mountinfo.
func FindCgroupMemory() (*CgroupMemory, error) {
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("resmon: cgroup: %w", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("resmon: cgroup: %w", err)
	}
	return findCgroupMemory(cg, mi)
}

// findCgroupMemory is FindCgroupMemory on the files' contents: the v1
// memory controller when it is mounted (a hybrid host accounts memory
// there), else the v2 unified hierarchy.
func findCgroupMemory(procCgroup, mountinfo []byte) (*CgroupMemory, error) {
	var v1Path, v2Path string
	var haveV1, haveV2 bool
	for _, line := range strings.Split(string(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2Path, haveV2 = parts[2], true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1Path, haveV1 = parts[2], true
			}
		}
	}
	var v1Mount, v1Root, v2Mount, v2Root string
	for _, line := range strings.Split(string(mountinfo), "\n") {
		// id parent major:minor root mountpoint options... - fstype source superoptions
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, p := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(p) < 1 {
			continue
		}
		switch p[0] {
		case "cgroup2":
			if v2Mount == "" {
				v2Mount, v2Root = unescapeMount(f[4]), f[3]
			}
		case "cgroup":
			if len(p) >= 3 && v1Mount == "" {
				for _, o := range strings.Split(p[2], ",") {
					if o == "memory" {
						v1Mount, v1Root = unescapeMount(f[4]), f[3]
					}
				}
			}
		}
	}
	switch {
	case haveV1 && v1Mount != "":
		return &CgroupMemory{Version: 1, Dir: cgroupDir(v1Mount, v1Root, v1Path)}, nil
	case haveV2 && v2Mount != "":
		dir := cgroupDir(v2Mount, v2Root, v2Path)
		c := &CgroupMemory{Version: 2, Dir: dir}
		for d := dir; ; d = filepath.Dir(d) {
			c.dirs = append(c.dirs, d)
			if d == v2Mount || len(d) <= len(v2Mount) || d == "/" {
				break
			}
		}
		return c, nil
	}
	return nil, fmt.Errorf("resmon: no memory cgroup: neither the v1 memory controller nor cgroup v2 is mounted for this process")
}

// cgroupDir is where cgroup path p (as /proc/self/cgroup names it) is,
// under a mount of the hierarchy's root directory root at mount. In a
// cgroup namespace p is relative to the namespace's root, which is the
// mount's root too.
func cgroupDir(mount, root, p string) string {
	if rel, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(rel, "..") {
		return filepath.Join(mount, rel)
	}
	return filepath.Join(mount, p)
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// Read returns the cgroup's memory usage, less its inactive page cache
// (which the kernel reclaims before it OOM-kills: the working set, as
// the kubelet counts it), and its limit; limit 0: the cgroup has none.
func (c *CgroupMemory) Read() (usage, limit uint64, err error) {
	if c.Version == 1 {
		return c.readV1()
	}
	return c.readV2()
}

func (c *CgroupMemory) readV2() (usage, limit uint64, err error) {
	// The tightest memory.max of the cgroup and its ancestors; the usage
	// is that cgroup's (it counts its descendants, this one among them).
	usageDir := c.Dir
	for _, d := range c.dirs {
		b, err := os.ReadFile(filepath.Join(d, "memory.max"))
		if err != nil {
			continue // the root has no memory.max
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			continue
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("resmon: %s: %q: not a number", filepath.Join(d, "memory.max"), s)
		}
		if limit == 0 || n < limit {
			limit, usageDir = n, d
		}
	}
	usage, err = readUint(filepath.Join(usageDir, "memory.current"))
	if err != nil {
		return 0, 0, err
	}
	if inactive, ok := statValue(filepath.Join(usageDir, "memory.stat"), "inactive_file"); ok && inactive < usage {
		usage -= inactive
	}
	return usage, limit, nil
}

func (c *CgroupMemory) readV1() (usage, limit uint64, err error) {
	usage, err = readUint(filepath.Join(c.Dir, "memory.usage_in_bytes"))
	if err != nil {
		return 0, 0, err
	}
	stat := filepath.Join(c.Dir, "memory.stat")
	// The limit of the cgroup or of an ancestor, whichever is tighter.
	limit, ok := statValue(stat, "hierarchical_memory_limit")
	if !ok {
		if limit, err = readUint(filepath.Join(c.Dir, "memory.limit_in_bytes")); err != nil {
			return 0, 0, err
		}
	}
	if limit >= unlimited {
		limit = 0
	}
	if inactive, ok := statValue(stat, "total_inactive_file"); ok && inactive < usage {
		usage -= inactive
	}
	return usage, limit, nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("resmon: %w", err)
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resmon: %s: %q: not a number", path, bytes.TrimSpace(b))
	}
	return n, nil
}

// statValue reads key's value from a memory.stat file ("key value" lines).
func statValue(path, key string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseUint(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
