package resmon

import (
	"fmt"
	"os"
	"syscall"
)

// OpenFDs counts this process's open file descriptors.
func OpenFDs() (int, error) {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, fmt.Errorf("resmon: open file descriptors: %w", err)
	}
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(1024)
		n += len(names)
		if err != nil || len(names) == 0 {
			break
		}
	}
	return n - 1, nil // the directory being read
}

// FDLimit is the soft RLIMIT_NOFILE.
func FDLimit() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("resmon: RLIMIT_NOFILE: %w", err)
	}
	return rl.Cur, nil
}
