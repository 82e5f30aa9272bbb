package pgtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// initCluster makes a new cluster in data, owned by uid:gid (-1: this
// process's user). initdb costs about 2.5 s of CPU and a copy of its result
// under 0.5 s, and a test run makes many clusters (one per package, one per
// test that stops its server), so initdb runs once per machine into a
// template (per PostgreSQL binaries, user and locale) and each cluster is a
// copy of it. Where the template cannot be made or copied, initdb runs
// into data, as it always did.
func initCluster(bin, data string, uid, gid int) error {
	if tmpl, err := template(bin, uid, gid); err == nil {
		if err := copyTree(tmpl, data, uid, gid); err == nil {
			return nil
		}
		os.RemoveAll(data)
	}
	return initdb(bin, data)
}

// initdb runs initdb into data (whose parent the postgres user owns).
func initdb(bin, data string) error {
	cmd := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
	if _, _, err := asPostgres(cmd); err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out)
	}
	return nil
}

// template returns the template cluster's data directory under
// $TMPDIR/capgate-pgtest-template, making it with initdb the first time.
// Its name is a hash of what initdb's result depends on: the binaries
// (their directory and version), the owner, and the locale.
func template(bin string, uid, gid int) (string, error) {
	version, err := exec.Command(filepath.Join(bin, "initdb"), "--version").Output()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%d:%d\n", bin, version, uid, gid)
	for _, k := range []string{"LANG", "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES"} {
		fmt.Fprintf(h, "%s=%s\n", k, os.Getenv(k))
	}
	root := filepath.Join(os.TempDir(), "capgate-pgtest-template")
	dir := filepath.Join(root, hex.EncodeToString(h.Sum(nil)[:12]))
	data := filepath.Join(dir, "data")
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		return data, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	removeStale(root)
	// initdb into a fresh directory renamed into place, so that a
	// concurrent test binary sees the template whole or not at all.
	tmp, err := os.MkdirTemp(root, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if uid >= 0 {
		if err := os.Chown(tmp, uid, gid); err != nil {
			return "", err
		}
	}
	if err := initdb(bin, filepath.Join(tmp, "data")); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another process may have won the race; its template is as good.
		if _, statErr := os.Stat(filepath.Join(data, "PG_VERSION")); statErr != nil {
			return "", err
		}
	}
	return data, nil
}

// removeStale removes what an interrupted template left more than an
// hour ago.
func removeStale(root string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), ".tmp-") && time.Since(info.ModTime()) > time.Hour {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

// copyTree copies the directory src to dst (which must not exist), with
// the modes of src, owned by uid:gid when uid >= 0.
func copyTree(src, dst string, uid, gid int) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			err = os.Mkdir(to, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			var target string
			if target, err = os.Readlink(path); err == nil {
				err = os.Symlink(target, to)
			}
		case d.Type().IsRegular():
			err = copyFile(path, to, info.Mode().Perm())
		default:
			err = fmt.Errorf("%s: not a file, directory or symlink", path)
		}
		if err == nil && uid >= 0 {
			err = os.Lchown(to, uid, gid)
		}
		return err
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
