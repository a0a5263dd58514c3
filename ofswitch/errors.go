package ofswitch

import (
	"errors"
	"fmt"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// ErrDisconnected is wrapped by the errors of requests that the loss of the connection cut short. The
// switch may or may not have applied what such a request sent.
var ErrDisconnected = errors.New("openflow connection lost")

// ErrClosed is wrapped by the errors of requests on a closed session.
var ErrClosed = errors.New("openflow session closed")

// BundleError says that the switch rejected a bundle (or a message given to Send) and which of the
// messages it blamed.
type BundleError struct {
	// Index is the index into the messages given to Bundle or Send of the message the switch
	// rejected, or -1 when it named none (e.g. the bundle could not be opened or committed).
	Index int
	// Type and Code are the OpenFlow error of that message; for experimenter errors (the ONF bundle
	// extension's OFPBFC_*) Type is 0xffff and Code the experimenter error type.
	Type, Code uint16
	// Msg is the error's OpenFlow name, e.g. OFPBAC_BAD_OUT_GROUP.
	Msg string
	// Cause is the full error about that message (or about the bundle itself).
	Cause *openflow.OFError
	// Other holds further errors the switch sent for the same request, e.g. OFPBFC_MSG_FAILED.
	Other []*openflow.OFError
}

func newBundleError(index int, cause *openflow.OFError) *BundleError {
	code := cause.Code
	if cause.Type == openflow.ErrorTypeExperimenter {
		code = cause.ExpType
	}
	return &BundleError{Index: index, Type: cause.Type, Code: code, Msg: cause.Name(), Cause: cause}
}

func (e *BundleError) Error() string {
	s := e.Msg
	for _, o := range e.Other {
		s += " + " + o.Name()
	}
	if e.Index >= 0 {
		return fmt.Sprintf("switch rejected message %d: %s", e.Index, s)
	}
	return "switch rejected the bundle: " + s
}

// FailedMessage implements reconcile.FailedMessageError.
func (e *BundleError) FailedMessage() int { return e.Index }

func (e *BundleError) Unwrap() error { return e.Cause }
