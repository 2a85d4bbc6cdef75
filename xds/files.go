package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hotproxy/hotproxy/internal/safefile"
)

// secretFiles writes the certificates, keys and CA bundles that arrive as
// bytes (SDS secrets, inline data sources) to files, because config names
// TLS material by path, as the TOML file does: one path for both sources
// keeps tlsconf, its rotation and `hotproxy validate` unchanged. A file is
// named by the SHA-256 of its content, so equal bytes share a file, a
// rotated certificate gets a new path (what makes a snapshot differ), and
// a file once written never changes under a reader. Files are 0600 in a
// private directory (0700, ours): a key is never readable by others.
type secretFiles struct {
	dir string
	mu  sync.Mutex // guards written
	// written are the files this client wrote or found, by path.
	written map[string]bool
}

func newSecretFiles(dir string) (*secretFiles, func(), error) {
	cleanup := func() {}
	if dir == "" {
		d, err := os.MkdirTemp("", "hotproxy-xds-secrets-")
		if err != nil {
			return nil, nil, fmt.Errorf("xds: secret directory: %w", err)
		}
		dir = d
		cleanup = func() { os.RemoveAll(d) }
	}
	if err := safefile.MakePrivateDir(dir); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("xds: secret directory %s: %w (give [xds] a directory of its own, owned by this user, mode 0700)", dir, err)
	}
	return &secretFiles{dir: dir, written: map[string]bool{}}, cleanup, nil
}

// write returns the path of a file holding data, writing it if needed.
func (s *secretFiles) write(data []byte) (string, error) {
	sum := sha256.Sum256(data)
	path := filepath.Join(s.dir, hex.EncodeToString(sum[:])+".pem")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written[path] {
		return path, nil
	}
	if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
		s.written[path] = true
		return path, nil
	}
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := safefile.Open(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("xds: writing a secret to %s: %w", s.dir, err)
	}
	_, err = f.Write(data)
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("xds: writing a secret to %s: %w", s.dir, err)
	}
	s.written[path] = true
	return path, nil
}

// prune removes the files this client wrote that keep names no longer
// holds; they belong to no accepted or pending resource.
func (s *secretFiles) prune(keep map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for path := range s.written {
		if !keep[path] && strings.HasPrefix(path, s.dir) {
			os.Remove(path)
			delete(s.written, path)
		}
	}
}

func filepathIsAbs(p string) bool { return filepath.IsAbs(p) }
