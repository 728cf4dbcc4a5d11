package main

import (
	"flag"
	"io"
	"testing"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/docgen"
)

var update = flag.Bool("update", false, "rewrite the generated parts of the docs from the code (make docs)")

// TestFlagDocs holds docs/configuration.md's table of gateway-agent flags
// to the flags run parses: names, variables, defaults (DefaultConfig, not
// -dev's) and usage text.
func TestFlagDocs(t *testing.T) {
	cfg := agent.DefaultConfig()
	fs, _ := newFlagSet(&cfg, io.Discard)
	docgen.Check(t, "../../docs/configuration.md", "flags:gateway-agent", docgen.FlagTable(fs), *update)
}
