package docgen

import (
	"flag"
	"os"

	"github.com/ration-dev/ration/internal/envflag"
)

// FlagTable renders the flags of fs (envflag.Describe) as a table of flag,
// variable, default and meaning. A default that is this machine's host
// name (the -id of both binaries) is written "host name".
func FlagTable(fs *flag.FlagSet) string {
	host, _ := os.Hostname()
	var rows [][]string
	for _, f := range envflag.Describe(fs) {
		name := "-" + f.Name
		if f.Arg != "" {
			name += " " + f.Arg
		}
		def := Code(f.Default)
		if f.Name == "id" && host != "" && f.Default == host {
			def = "host name"
		}
		rows = append(rows, []string{Code(name), Code(f.Env), def, f.Usage})
	}
	return Table([]string{"flag", "environment", "default", "meaning"}, rows)
}
