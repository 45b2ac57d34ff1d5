// Command modproxy writes a Go module proxy as files, serving the
// repository's two modules (the main module and client/) at one version,
// made from the files git knows of (tracked, and untracked but not
// ignored) exactly as a module proxy makes them from a tag:
//
//	go run ./scripts/modproxy -o DIR -version v0.4.0-dev
//	GOPROXY=file://DIR,https://proxy.golang.org GONOSUMDB=github.com/effect-ledger/effect-ledger \
//	  go install github.com/effect-ledger/effect-ledger/cmd/ledger-mcp@v0.4.0-dev
//
// scripts/release runs it; CI installs every command from it into an
// empty module cache, which is what `go install …@vX.Y.Z` does once the
// tags vX.Y.Z and client/vX.Y.Z are pushed.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

func main() {
	out := flag.String("o", "", "directory to write the proxy into (GOPROXY=file://DIR)")
	version := flag.String("version", "", "the version to serve both modules at (vX.Y.Z or vX.Y.Z-dev)")
	flag.Parse()
	if *out == "" || *version == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, *version); err != nil {
		slog.Error("modproxy", "err", err)
		os.Exit(1)
	}
}

// file is one file of the source tree, as modzip.File.
type file struct{ root, rel, path string }

func (f file) Path() string                 { return f.path }
func (f file) Lstat() (fs.FileInfo, error)  { return os.Lstat(filepath.Join(f.root, f.rel)) }
func (f file) Open() (io.ReadCloser, error) { return os.Open(filepath.Join(f.root, f.rel)) }

func run(out, version string) error {
	if module.CanonicalVersion(version) != version {
		return fmt.Errorf("version %q is not a canonical semantic version", version)
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	names, err := gitFiles(root)
	if err != nil {
		return err
	}
	// The commit time names the version's time: the same commit gives
	// the same proxy.
	stamp, err := exec.Command("git", "log", "-1", "--format=%cI").Output()
	if err != nil {
		return fmt.Errorf("git log: %w", err)
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(stamp)))
	if err != nil {
		return fmt.Errorf("commit time: %w", err)
	}
	for _, dir := range []string{".", "client"} {
		if err := write(out, root, dir, version, t.UTC(), names); err != nil {
			return err
		}
	}
	return nil
}

// gitFiles lists the files of the tree at root that git knows of.
func gitFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var names []string
	for _, n := range strings.Split(strings.TrimRight(string(b), "\x00"), "\x00") {
		if _, err := os.Lstat(filepath.Join(root, n)); errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree
		}
		names = append(names, n)
	}
	return names, nil
}

// write adds the module in dir (relative to root) at version to the proxy
// in out: its .mod, .zip and .info, and the version in its list.
func write(out, root, dir, version string, t time.Time, names []string) error {
	gomod, err := os.ReadFile(filepath.Join(root, dir, "go.mod"))
	if err != nil {
		return err
	}
	modPath := modfile.ModulePath(gomod)
	mv := module.Version{Path: modPath, Version: version}
	var files []modzip.File
	for _, n := range names {
		rel := n
		if dir != "." {
			if !strings.HasPrefix(n, dir+"/") {
				continue
			}
			rel = strings.TrimPrefix(n, dir+"/")
		}
		files = append(files, file{root: root, rel: n, path: path.Clean(rel)})
	}
	var zip bytes.Buffer
	if err := modzip.Create(&zip, mv, files); err != nil {
		return err
	}
	esc, err := module.EscapePath(modPath)
	if err != nil {
		return err
	}
	at := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, t})
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{version + ".mod": gomod, version + ".zip": zip.Bytes(), version + ".info": info} {
		if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
			return err
		}
	}
	list := filepath.Join(at, "list")
	old, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if !bytes.Contains(append([]byte("\n"), old...), []byte("\n"+version+"\n")) {
		old = append(old, version+"\n"...)
	}
	if err := os.WriteFile(list, old, 0o644); err != nil {
		return err
	}
	slog.Info("modproxy: served", "module", modPath, "version", version, "files", len(files), "zip_bytes", zip.Len())
	return nil
}
