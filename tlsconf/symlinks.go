package tlsconf

import (
	"os"
	"path/filepath"
)

// maxSymlinkHops bounds the symlinks followed from one file (the kernel's
// own bound is 40; a loop ends here too).
const maxSymlinkHops = 16

// symlinkDirs returns the directory of path and, while path is a symlink,
// the directory of each link it leads through, up to the file itself.
func symlinkDirs(path string) []string {
	var dirs []string
	for range maxSymlinkHops {
		dirs = append(dirs, filepath.Dir(path))
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			return dirs
		}
		target, err := os.Readlink(path)
		if err != nil {
			return dirs
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	return dirs
}
