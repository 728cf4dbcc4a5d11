package main

import (
	"flag"
	"io"
	"testing"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/docgen"
)

var update = flag.Bool("update", false, "rewrite the generated parts of the docs from the code (make docs)")

// TestFlagDocs holds docs/configuration.md's table of coordinator flags to
// the flags run parses: names, variables, defaults (DefaultConfig, not
// -dev's) and usage text.
func TestFlagDocs(t *testing.T) {
	cfg, opts := coordinator.DefaultConfig(), defaultOptions()
	fs, _ := newFlagSet(&cfg, &opts, io.Discard)
	docgen.Check(t, "../../docs/configuration.md", "flags:coordinator", docgen.FlagTable(fs), *update)
}
