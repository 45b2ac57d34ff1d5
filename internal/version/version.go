// Package version tells which build of ledgerd and ledgerctl is running
// and which versions of the contract (docs/spec.md) it implements. The
// build's version comes from the module's build info, which the go command
// stamps into every binary: the module version for `go install
// module@version`, otherwise the version control revision it was built from.
package version

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Contract is the newest contract version the binaries implement.
const Contract = "v1.1"

// Contracts lists every contract version the binaries implement, oldest
// first. v1.1 only adds to v1 (docs/spec.md, "Versions"), so a v1 client
// talks to a v1.1 server unchanged.
var Contracts = []string{"v1", "v1.1"}

// Info is what a binary knows about its own build.
type Info struct {
	// Binary is the program name, ledgerd or ledgerctl.
	Binary string `json:"binary"`
	// Version is the module version ("v1.2.0", or a pseudo-version such as
	// "v0.0.0-20261201013927-6aedb58abcde+dirty" for a build from a
	// checkout), or "(devel)" when the build recorded none.
	Version string `json:"version"`
	// Module is the main module's path.
	Module string `json:"module"`
	// Revision is the version control revision the binary was built from,
	// empty when the build did not record one (-buildvcs=false, no VCS).
	Revision string `json:"revision,omitempty"`
	// Time is the commit time of Revision (RFC 3339).
	Time string `json:"time,omitempty"`
	// Modified reports that the working tree had uncommitted changes.
	Modified bool `json:"modified"`
	// Go is the toolchain that built the binary, with the target platform.
	Go string `json:"go"`
	// Contract is the newest contract version implemented.
	Contract string `json:"contract"`
	// Contracts lists every contract version implemented.
	Contracts []string `json:"contracts"`
}

// Read returns the build info of the running binary named binary.
func Read(binary string) Info {
	bi, _ := debug.ReadBuildInfo()
	return FromBuildInfo(binary, bi)
}

// FromBuildInfo returns the Info of binary from build info bi, which may be
// nil (a binary built without module support).
func FromBuildInfo(binary string, bi *debug.BuildInfo) Info {
	info := Info{
		Binary:    binary,
		Version:   "(devel)",
		Go:        runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		Contract:  Contract,
		Contracts: append([]string(nil), Contracts...),
	}
	if bi == nil {
		return info
	}
	info.Module = bi.Main.Path
	if v := bi.Main.Version; v != "" {
		info.Version = v
	}
	if bi.GoVersion != "" {
		info.Go = bi.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// Short is the one-word build version: the module version when it is a
// release, else the revision's first 12 hex digits with "+modified" for a
// dirty tree, else "(devel)".
func (i Info) Short() string {
	release := i.Version != "(devel)" && !strings.Contains(i.Version, "+dirty") &&
		!isPseudo(i.Version)
	switch {
	case release:
		return i.Version
	case i.Revision != "":
		rev := i.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if i.Modified {
			rev += "+modified"
		}
		return rev
	}
	return i.Version
}

// isPseudo reports whether v is a Go pseudo-version, a version the go
// command made up from a commit rather than a release tag.
func isPseudo(v string) bool {
	v, _, _ = strings.Cut(v, "+")
	// vX.Y.Z-yyyymmddhhmmss-abcdefabcdef or vX.Y.Z-pre.0.yyyymmddhhmmss-abcdefabcdef
	i := strings.LastIndexByte(v, '-')
	if i < 0 || len(v)-i-1 != 12 {
		return false
	}
	j := strings.LastIndexAny(v[:i], "-.")
	return j >= 0 && i-j-1 == 14
}

// String is the text `--version` prints, for example:
//
//	ledgerd 6aedb58abcde+modified
//	contract v1.1 (implements v1, v1.1)
//	module github.com/effect-ledger/effect-ledger v0.0.0-20261201013927-6aedb58abcde+dirty
//	revision 6aedb58abcde… (2026-12-01T01:39:27Z, modified)
//	go go1.26.0 linux/amd64
func (i Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", i.Binary, i.Short())
	fmt.Fprintf(&b, "contract %s (implements %s)\n", i.Contract, strings.Join(i.Contracts, ", "))
	if i.Module != "" {
		fmt.Fprintf(&b, "module %s %s\n", i.Module, i.Version)
	}
	if i.Revision != "" {
		var extra []string
		if i.Time != "" {
			extra = append(extra, i.Time)
		}
		if i.Modified {
			extra = append(extra, "modified")
		}
		fmt.Fprintf(&b, "revision %s", i.Revision)
		if len(extra) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(extra, ", "))
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "go %s\n", i.Go)
	return b.String()
}

// JSON is Info as one line of JSON.
func (i Info) JSON() []byte {
	b, _ := json.Marshal(i) // a struct of strings and bools always encodes
	return append(b, '\n')
}
