// Package examples holds the example files the README and the docs use.
// Both binaries' -dev modes run with the example rules, so that
// `gateway-agent -dev -coordinators` pointed at `coordinator -dev` knows
// every leased rule it asks for.
package examples

import (
	"bytes"
	_ "embed"
)

//go:embed rules.yaml
var rulesYAML []byte

// RulesFile is the name the example rules are parsed under.
const RulesFile = "examples/rules.yaml"

// Rules returns examples/rules.yaml.
func Rules() []byte { return bytes.Clone(rulesYAML) }
