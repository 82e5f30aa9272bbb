package app

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SecretNames are capgate's own secrets, which may come from files.
var SecretNames = []string{"CAPGATE_TOKEN_SECRET", "CAPGATE_STORE_KEY", "ASH_CONTEXT_TOKEN_SECRET"}

// SecretFiles reads each secret an operator keeps in a file rather than
// in an environment, where any process that can read /proc/<pid>/environ
// sees it: NAME_FILE names the file, or systemd's credentials directory
// ($CREDENTIALS_DIRECTORY, LoadCredential=NAME:...) holds a file NAME.
// names are SecretNames plus any the config renames (auth.secret_env).
// Each value found is set in this process's environment only (setenv
// never rewrites the /proc/<pid>/environ that capgate started with), and
// NAME_FILE is removed. NAME set directly as well as by a file is an error.
func SecretFiles(names []string, lookup func(string) (string, bool), setenv func(k, v string) error, unsetenv func(string) error) error {
	creds, _ := lookup("CREDENTIALS_DIRECTORY")
	for _, name := range names {
		path, fromFile := lookup(name + "_FILE")
		if !fromFile && creds != "" {
			if p := filepath.Join(creds, name); exists(p) {
				path, fromFile = p, true
			}
		}
		if !fromFile {
			continue
		}
		if _, set := lookup(name); set {
			return fmt.Errorf("%s is set and also read from %s: keep one", name, path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("%s: reading its file: %w", name, err)
		}
		v := strings.TrimRight(string(b), "\r\n")
		if strings.TrimSpace(v) == "" {
			return fmt.Errorf("%s: its file %s is empty", name, path)
		}
		if err := setenv(name, v); err != nil {
			return err
		}
		_ = unsetenv(name + "_FILE")
	}
	return nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }
