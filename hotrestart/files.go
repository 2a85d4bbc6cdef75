package hotrestart

import "os"

// CloseFiles closes every file of files, skipping nil ones: the sockets of
// a message that will not be used after all.
func CloseFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}
