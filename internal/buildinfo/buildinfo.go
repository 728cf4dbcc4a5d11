// Package buildinfo says which build of Ration is running: the version and
// commit the linker was given, and the Go version. Every binary prints it
// under -version, and the two servers export it as the ration_build_info
// gauge.
//
// make build, make install and deploy/docker/Dockerfile set both with
//
//	-ldflags "-X github.com/ration-dev/ration/internal/buildinfo.version=V -X github.com/ration-dev/ration/internal/buildinfo.commit=C"
//
// A binary built without them (go build, go run, go install of a path)
// reports version "dev" and the commit the go command stamped from the
// VCS checkout (vcs.revision), if any.
package buildinfo

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Set by the linker (-X); empty otherwise.
var (
	version string
	commit  string
)

const (
	// DevVersion is the version of a binary built without -ldflags.
	DevVersion = "dev"
	// UnknownCommit is the commit of a binary built without -ldflags
	// outside a VCS checkout.
	UnknownCommit = "unknown"
)

// Info is one binary's build.
type Info struct {
	Version string // "0.1.0", or DevVersion
	Commit  string // VCS revision, or UnknownCommit
	Go      string // runtime.Version(), e.g. "go1.26.8"
}

// Get returns the running binary's build.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return resolve(version, commit, runtime.Version(), bi)
}

// resolve fills what the linker did not set: version "dev", commit from
// the build's vcs.revision setting or "unknown".
func resolve(version, commit, goVersion string, bi *debug.BuildInfo) Info {
	if version == "" {
		version = DevVersion
	}
	if commit == "" && bi != nil {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				commit = s.Value
			}
		}
	}
	if commit == "" {
		commit = UnknownCommit
	}
	return Info{Version: version, Commit: commit, Go: goVersion}
}

// String is the line -version prints after the binary's name.
func (i Info) String() string {
	return fmt.Sprintf("version %s, commit %s, %s", i.Version, i.Commit, i.Go)
}

// Print writes "NAME version V, commit C, GO" and a newline: what every
// binary's -version prints.
func Print(w io.Writer, name string) {
	fmt.Fprintf(w, "%s %s\n", name, Get())
}

// FlagUsage is the usage text of every binary's -version flag.
const FlagUsage = "print the version, commit and Go version, then exit"

// MetricName is the name of the build gauge.
const MetricName = "ration_build_info"

// Collector returns the ration_build_info gauge: always 1, labelled with
// the running binary's version, commit and Go version.
func Collector() prometheus.Collector {
	return collector(Get())
}

func collector(i Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        MetricName,
		Help:        "Always 1; the labels say which build runs: version and commit (set at link time by make build or the Dockerfile; version \"dev\" otherwise) and the Go version.",
		ConstLabels: prometheus.Labels{"version": i.Version, "commit": i.Commit, "go": i.Go},
	})
	g.Set(1)
	return g
}
