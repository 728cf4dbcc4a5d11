package agent

import (
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// A string that is not UTF-8 is the caller's bad input, as HTTP's 400
// says for the same string, not a message gRPC failed to read: the codec
// keeps it for the handler, which answers InvalidArgument naming the
// field (an AllowStream request gets its own REASON_INVALID answer, and
// the stream goes on). Any other malformed message stays an error of the
// codec (INTERNAL, as proto.Unmarshal's would be).

// wireUTF8Error names the string field that is not UTF-8; it is
// errWireUTF8.
type wireUTF8Error struct{ field string }

func (e *wireUTF8Error) Error() string        { return e.field + ": " + errWireUTF8.Error() }
func (e *wireUTF8Error) Is(target error) bool { return target == errWireUTF8 }

// requestFields names AllowRequest's string fields by number.
var requestFields = map[protowire.Number]string{2: "rule", 3: "subject", 5: "request_id"}

// entryUTF8Error names a descriptors entry's string that is not UTF-8: its
// key, or the value of the key read so far.
func entryUTF8Error(isKey bool, key, bad string) error {
	switch {
	case isKey:
		return &wireUTF8Error{field: "descriptors: key " + strconv.Quote(truncate(bad))}
	case key != "":
		return &wireUTF8Error{field: fmt.Sprintf("descriptors[%q]", truncate(key))}
	default:
		return &wireUTF8Error{field: "descriptors: a value"}
	}
}

// inRequest places a batch's request error at its index.
func inRequest(i int, err error) error {
	var ue *wireUTF8Error
	if errors.As(err, &ue) {
		return fmt.Errorf("agent: AllowBatchRequest: %w", &wireUTF8Error{field: fmt.Sprintf("requests[%d].%s", i, ue.field)})
	}
	return err
}

// invalidString keeps a decoder's UTF-8 error in *dst for the handler,
// reporting the message read; any other error is the codec's.
func invalidString(err error, dst *error) error {
	*dst = nil
	var ue *wireUTF8Error
	if errors.As(err, &ue) {
		*dst = fmt.Errorf("%w: %w", ErrInvalidRequest, ue)
		return nil
	}
	return err
}
