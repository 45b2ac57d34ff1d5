// Package version tells which build of ledgerd and ledgerctl is running
// and which versions of the contract (docs/spec.md) it implements.
//
// A build's version is Release, the version of this source tree, unless
// the go command stamped a release tag of the module (a build from a
// clone checked out at the tag). Between releases Release is the next
// one with "-dev" (v0.4.0-dev), so that a build of main never claims a
// release it is not; such a build always names its commit too. Its
// revision is the version control revision the go command stamps, or,
// for a build without VCS stamping (-buildvcs=false, a source tarball),
// the one scripts/release links in with
//
//	-ldflags "-X github.com/effect-ledger/effect-ledger/internal/version.revision=<sha>"
//
// so every binary names its release and, where known, its commit.
package version

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Release is the version of this source tree: vX.Y.Z on the commit a
// release tag vX.Y.Z points at, and the next release with "-dev"
// (vX.Y.Z-dev) on every other commit. No release tag is cut yet: the
// tree is v0.4.0 in the making (schema 4, which v0.3.0 refuses).
const Release = "v0.4.0-dev"

// revision and modified are set by the linker (-X) for builds without VCS
// stamping; modified is "true" for a tree with uncommitted changes.
var (
	revision string
	modified string
)

// Contract is the newest contract version the binaries implement.
const Contract = "v1.4"

// Contracts lists every contract version the binaries implement, oldest
// first. v1.1 … v1.4 only add to v1 (docs/spec.md, "Versions"), so a v1
// client talks to a v1.4 server unchanged.
var Contracts = []string{"v1", "v1.1", "v1.2", "v1.3", "v1.4"}

// Info is what a binary knows about its own build.
type Info struct {
	// Binary is the program name, ledgerd or ledgerctl.
	Binary string `json:"binary"`
	// Version is the release: the module's release tag when the go
	// command stamped one, else Release.
	Version string `json:"version"`
	// Module is the main module's path.
	Module string `json:"module"`
	// ModuleVersion is the module version the go command stamped (a
	// release tag, a pseudo-version such as
	// "v0.0.0-20261201013927-6aedb58abcde+dirty" for a build from a
	// checkout, or "(devel)").
	ModuleVersion string `json:"module_version,omitempty"`
	// Revision is the version control revision the binary was built from:
	// the go command's VCS stamp, else the one linked in by scripts/release,
	// else empty.
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
	info := FromBuildInfo(binary, bi)
	if info.Revision == "" && revision != "" {
		info.Revision, info.Modified = revision, modified == "true"
	}
	return info
}

// FromBuildInfo returns the Info of binary from build info bi, which may be
// nil (a binary built without module support).
func FromBuildInfo(binary string, bi *debug.BuildInfo) Info {
	info := Info{
		Binary:    binary,
		Version:   Release,
		Go:        runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		Contract:  Contract,
		Contracts: append([]string(nil), Contracts...),
	}
	if bi == nil {
		return info
	}
	info.Module = bi.Main.Path
	info.ModuleVersion = bi.Main.Version
	if isRelease(bi.Main.Version) {
		info.Version = bi.Main.Version
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

// Short is the one-word build version: the release alone for a build of
// the release itself ("v0.4.0"), else the version, "+", the revision's
// first 12 hex digits and ".dirty" for uncommitted changes
// ("v0.4.0-dev+6aedb58abcde.dirty", a semantic version whose build
// metadata is the commit).
func (i Info) Short() string {
	if i.Revision == "" || i.isReleaseBuild() {
		return i.Version
	}
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if i.Modified {
		rev += ".dirty"
	}
	return i.Version + "+" + rev
}

// isReleaseBuild reports whether the build is of a clean tree that is the
// release: the go command stamped the release tag, or stamped no version
// at all and the revision was linked in (scripts/release) to a tree whose
// Release is not a -dev version.
func (i Info) isReleaseBuild() bool {
	if i.Modified {
		return false
	}
	if i.ModuleVersion != i.Version && isDev(i.Version) {
		return false
	}
	return i.ModuleVersion == i.Version || i.ModuleVersion == "" || i.ModuleVersion == "(devel)"
}

// isRelease reports whether v is a release tag rather than "(devel)", a
// pseudo-version or a build of a modified tree.
func isRelease(v string) bool {
	return strings.HasPrefix(v, "v") && !strings.Contains(v, "+dirty") && !isPseudo(v)
}

// isDev reports whether v is a version between releases, vX.Y.Z-dev.
func isDev(v string) bool { return strings.HasSuffix(v, "-dev") }

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
//	ledgerd v0.4.0-dev+6aedb58abcde.dirty
//	contract v1.3 (implements v1, v1.1, v1.2, v1.3)
//	module github.com/effect-ledger/effect-ledger v0.0.0-20261201013927-6aedb58abcde+dirty
//	revision 6aedb58abcde… (2026-12-01T01:39:27Z, modified)
//	go go1.26.0 linux/amd64
func (i Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", i.Binary, i.Short())
	fmt.Fprintf(&b, "contract %s (implements %s)\n", i.Contract, strings.Join(i.Contracts, ", "))
	if i.Module != "" {
		fmt.Fprintf(&b, "module %s %s\n", i.Module, i.ModuleVersion)
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
