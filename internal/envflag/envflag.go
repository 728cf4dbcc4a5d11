package envflag

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// Setting is one configurable value. Value points at the field: *string,
// *bool, *int, *uint64, *float64 or *time.Duration. Env is the variable's
// name without the prefix ("" for a flag with no variable).
type Setting struct {
	Flag, Env, Usage string
	Value            any
	// Redact, when set, is how a value that may hold a secret (a URL with
	// a password) is printed: the default that -h and a flag error show
	// is the variable's value, and must not be printed as it is.
	Redact func(string) string
}

// Load applies the environment to every setting that has a variable,
// reporting every malformed value at once (each naming its variable); a
// malformed value leaves its field unchanged.
func Load(prefix string, settings []Setting, lookup func(string) (string, bool)) error {
	var errs []error
	for _, s := range settings {
		if s.Env == "" {
			continue
		}
		v, ok := lookup(prefix + s.Env)
		if !ok {
			continue
		}
		if err := set(s.Value, v); err != nil {
			if s.Redact != nil {
				v = s.Redact(v)
			}
			errs = append(errs, fmt.Errorf("%s%s=%q: %w", prefix, s.Env, v, err))
		}
	}
	return errors.Join(errs...)
}

// Bind registers every setting as a flag on fs, its default being the
// field's current value (so flags override the environment already loaded),
// and names the variable in the usage text.
func Bind(fs *flag.FlagSet, prefix string, settings []Setting) {
	for _, s := range settings {
		usage := s.Usage
		if s.Env != "" {
			usage = fmt.Sprintf("%s (env %s%s)", s.Usage, prefix, s.Env)
		}
		// Describe reads the variable back from this suffix.
		switch p := s.Value.(type) {
		case *string:
			fs.StringVar(p, s.Flag, *p, usage)
		case *bool:
			fs.BoolVar(p, s.Flag, *p, usage)
		case *int:
			fs.IntVar(p, s.Flag, *p, usage)
		case *uint64:
			fs.Uint64Var(p, s.Flag, *p, usage)
		case *float64:
			fs.Float64Var(p, s.Flag, *p, usage)
		case *time.Duration:
			fs.DurationVar(p, s.Flag, *p, usage)
		default:
			panic(fmt.Sprintf("envflag: setting %s has unsupported type %T", s.Flag, s.Value)) // a programming error in a settings table
		}
		if f := fs.Lookup(s.Flag); s.Redact != nil && f.DefValue != "" {
			// DefValue is only printed (usage, -h); the value itself is
			// unchanged.
			f.DefValue = s.Redact(f.DefValue)
		}
	}
}

func set(dst any, v string) error {
	switch p := dst.(type) {
	case *string:
		*p = v
	case *bool:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("not a boolean")
		}
		*p = b
	case *int:
		n, err := strconv.Atoi(v)
		if err != nil {
			return errors.New("not an integer")
		}
		*p = n
	case *uint64:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return errors.New("not a non-negative integer")
		}
		*p = n
	case *float64:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return errors.New("not a number")
		}
		*p = f
	case *time.Duration:
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		*p = d
	default:
		return fmt.Errorf("unsupported type %T", dst)
	}
	return nil
}

// Flag is one flag of a FlagSet as the documentation shows it.
type Flag struct {
	Name    string // without the dash
	Arg     string // what -h names its value ("string", "duration", "int", ...; "" for a boolean)
	Env     string // the variable Bind named, prefix included ("" for none)
	Default string // the default as -h would print it ("" for an empty string)
	Usage   string // the usage text, without the variable
}

// envSuffix is what Bind appends to the usage of a setting with a variable.
var envSuffix = regexp.MustCompile(`(?s)^(.*) \(env ([A-Za-z0-9_]+)\)$`)

// Describe lists every flag of fs in name order, with the variable Bind
// named in its usage: the table docs/configuration.md is generated from.
// Flags registered on fs other than by Bind are listed without a variable.
func Describe(fs *flag.FlagSet) []Flag {
	var out []Flag
	fs.VisitAll(func(f *flag.Flag) {
		d := Flag{Name: f.Name, Default: f.DefValue}
		cp := *f
		if m := envSuffix.FindStringSubmatch(f.Usage); m != nil {
			cp.Usage, d.Env = m[1], m[2]
		}
		d.Arg, d.Usage = flag.UnquoteUsage(&cp)
		out = append(out, d)
	})
	return out
}
