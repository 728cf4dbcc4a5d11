// Package envflag owns the binding of a process's settings to command-line
// flags and RATION_* environment variables from ONE table, so that a flag
// never lacks its variable (or the reverse) and both binaries layer them the
// same way: built-in default, then environment (Load), then flags (Bind).
// Describe reads the table back from a FlagSet, so that the docs' flag
// tables are generated from it (internal/docgen).
package envflag
