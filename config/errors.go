package config

import (
	"fmt"
	"strconv"
	"strings"
)

// FieldError is a problem with the value of one key, or with a combination
// of keys. Its text is "FILE:LINE: KEY: MESSAGE[: CAUSE]"; the file and line
// are left out when unknown.
type FieldError struct {
	File string // file name given to Parse or Load; "" if none
	Line int    // 1-based line of the key; 0 if unknown
	// Key is the dotted path of the key, e.g. "flowCollector.address" or
	// "flowLogger.filters[1].egressNetworkPolicyRuleActions".
	Key string
	Msg string // what is wrong
	Err error  // the underlying cause, if any
}

func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(location(e.File, e.Line))
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Err != nil {
		if e.Msg != "" {
			b.WriteString(": ")
		}
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *FieldError) Unwrap() error { return e.Err }

// UnknownKeyError is a key the configuration does not have. Its text is
// `FILE:LINE: unknown key "KEY" (did you mean "SUGGESTION"?)`.
type UnknownKeyError struct {
	File string
	Line int
	// Key is the dotted path of the unknown key.
	Key string
	// Suggestion is the dotted path of a known key that is probably meant,
	// or "".
	Suggestion string
}

func (e *UnknownKeyError) Error() string {
	s := location(e.File, e.Line) + "unknown key " + strconv.Quote(e.Key)
	if e.Suggestion != "" {
		s += fmt.Sprintf(" (did you mean %q?)", e.Suggestion)
	}
	return s
}

// location renders the "FILE:LINE: " prefix of an error.
func location(file string, line int) string {
	switch {
	case file != "" && line > 0:
		return fmt.Sprintf("%s:%d: ", file, line)
	case file != "":
		return file + ": "
	case line > 0:
		return fmt.Sprintf("line %d: ", line)
	}
	return ""
}

// errorLine is the line an error points at, for sorting; 0 if none.
func errorLine(err error) int {
	switch e := err.(type) {
	case *FieldError:
		return e.Line
	case *UnknownKeyError:
		return e.Line
	}
	return 0
}
