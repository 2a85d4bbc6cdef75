package resmon

import (
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCgroupV2: the tightest memory.max of the cgroup and its ancestors
// is the limit, the usage that cgroup's less its inactive page cache.
func TestCgroupV2(t *testing.T) {
	root := t.TempDir()
	mi := "30 23 0:26 / " + root + " rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	c, err := findCgroupMemory([]byte("0::/app.slice/proxy.service\n"), []byte(mi))
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != 2 || c.Dir != filepath.Join(root, "app.slice/proxy.service") {
		t.Fatalf("found %+v", c)
	}
	write(t, filepath.Join(root, "app.slice/proxy.service/memory.max"), "max\n")
	write(t, filepath.Join(root, "app.slice/proxy.service/memory.current"), "1000\n")
	write(t, filepath.Join(root, "app.slice/memory.max"), "4096\n")
	write(t, filepath.Join(root, "app.slice/memory.current"), "3000\n")
	write(t, filepath.Join(root, "app.slice/memory.stat"), "anon 2000\ninactive_file 500\nactive_file 500\n")
	usage, limit, err := c.Read()
	if err != nil || usage != 2500 || limit != 4096 {
		t.Fatalf("Read = %d, %d, %v; want 2500, 4096 (the slice's limit and usage)", usage, limit, err)
	}
	write(t, filepath.Join(root, "app.slice/memory.max"), "max\n")
	if _, limit, err := c.Read(); err != nil || limit != 0 {
		t.Fatalf("no limit anywhere: limit %d, %v; want 0", limit, err)
	}
	write(t, filepath.Join(root, "app.slice/proxy.service/memory.max"), "garbage\n")
	if _, _, err := c.Read(); err == nil {
		t.Fatal("a memory.max that is not a number was accepted")
	}
}

// TestCgroupV1: the memory controller's hierarchy wins on a hybrid host;
// "unlimited" is no limit.
func TestCgroupV1(t *testing.T) {
	root := t.TempDir()
	mem := filepath.Join(root, "memory")
	mi := "35 31 0:32 / " + mem + " rw,relatime - cgroup cgroup rw,memory\n" +
		"41 31 0:38 / " + filepath.Join(root, "unified") + " rw,relatime - cgroup2 cgroup2 rw\n"
	c, err := findCgroupMemory([]byte("4:memory:/docker/abc\n0::/\n"), []byte(mi))
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != 1 || c.Dir != filepath.Join(mem, "docker/abc") {
		t.Fatalf("found %+v", c)
	}
	dir := c.Dir
	write(t, filepath.Join(dir, "memory.usage_in_bytes"), "8000\n")
	write(t, filepath.Join(dir, "memory.limit_in_bytes"), "9223372036854771712\n")
	write(t, filepath.Join(dir, "memory.stat"), "cache 100\nhierarchical_memory_limit 10000\ntotal_inactive_file 1000\n")
	usage, limit, err := c.Read()
	if err != nil || usage != 7000 || limit != 10000 {
		t.Fatalf("Read = %d, %d, %v; want 7000, 10000", usage, limit, err)
	}
	write(t, filepath.Join(dir, "memory.stat"), "hierarchical_memory_limit 9223372036854771712\n")
	if _, limit, err := c.Read(); err != nil || limit != 0 {
		t.Fatalf("unlimited: limit %d, %v; want 0", limit, err)
	}
	// In a container's cgroup namespace, the mount's root is the
	// container's cgroup and /proc/self/cgroup says "/".
	mi = "35 31 0:32 /docker/abc " + mem + " rw - cgroup cgroup rw,memory\n"
	if c, err := findCgroupMemory([]byte("4:memory:/\n"), []byte(mi)); err != nil || c.Dir != mem {
		t.Fatalf("namespaced: %+v, %v; want %s", c, err, mem)
	}
	if _, err := findCgroupMemory([]byte("1:cpu:/\n"), []byte("")); err == nil {
		t.Fatal("no memory cgroup mounted, and no error")
	}
}

func TestHeapAndFDs(t *testing.T) {
	r := NewHeap().Read()
	if r.InUse == 0 || r.Runtime < r.InUse {
		t.Errorf("heap reading %+v: nothing in use, or less in the runtime than in its heap", r)
	}
	n, err := OpenFDs()
	if err != nil || n < 3 {
		t.Fatalf("OpenFDs = %d, %v", n, err)
	}
	f, _ := os.Open(os.DevNull)
	defer f.Close()
	if m, _ := OpenFDs(); m < n+1 {
		t.Errorf("OpenFDs after one more open = %d, want at least %d", m, n+1)
	}
	if l, err := FDLimit(); err != nil || l < uint64(n) {
		t.Errorf("FDLimit = %d, %v", l, err)
	}
}
