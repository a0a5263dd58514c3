package openflow

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrVersion says the switch does not offer OpenFlow 1.3.
var ErrVersion = errors.New("openflow version mismatch")

// OFError is an OFPT_ERROR from the switch.
type OFError struct {
	Type, Code uint16
	// Experimenter errors (OpenFlow 1.3's ONF bundle extension) carry their own type and ID.
	ExpType      uint16
	Experimenter uint32
	// Data is the start of the message that failed, as the switch echoed it.
	Data []byte
}

func (e *OFError) Error() string { return e.Name() }

// Name returns the OpenFlow name of the error, e.g. OFPBAC_BAD_OUT_GROUP.
func (e *OFError) Name() string {
	if e.Type == ErrorTypeExperimenter {
		if e.Experimenter == ONFExperimenter && e.ExpType >= 2300 && int(e.ExpType) < 2300+len(bundleFailedNames) {
			return bundleFailedNames[e.ExpType-2300]
		}
		return fmt.Sprintf("experimenter %#x error type %d", e.Experimenter, e.ExpType)
	}
	if int(e.Type) < len(errorNames) {
		t := errorNames[e.Type]
		if int(e.Code) < len(t.codes) {
			return t.codes[e.Code]
		}
		return fmt.Sprintf("%s code %d", t.name, e.Code)
	}
	return fmt.Sprintf("error type %d code %d", e.Type, e.Code)
}

// ParseError decodes the body of an OFPT_ERROR; a body too short for its fields still yields an error.
func ParseError(body []byte) *OFError {
	if len(body) < 4 {
		return &OFError{Type: 0xfffe, Code: uint16(len(body))}
	}
	e := &OFError{Type: binary.BigEndian.Uint16(body), Code: binary.BigEndian.Uint16(body[2:])}
	data := body[4:]
	if e.Type == ErrorTypeExperimenter {
		e.ExpType = e.Code
		if len(body) >= 8 {
			e.Experimenter = binary.BigEndian.Uint32(body[4:])
			data = body[8:]
		}
	}
	e.Data = append([]byte(nil), data...)
	return e
}

type errorType struct {
	name  string
	codes []string
}

// OpenFlow 1.3 §A.4.4 error types and codes.
var errorNames = []errorType{
	{"OFPET_HELLO_FAILED", []string{"OFPHFC_INCOMPATIBLE", "OFPHFC_EPERM"}},
	{"OFPET_BAD_REQUEST", []string{"OFPBRC_BAD_VERSION", "OFPBRC_BAD_TYPE", "OFPBRC_BAD_MULTIPART", "OFPBRC_BAD_EXPERIMENTER",
		"OFPBRC_BAD_EXP_TYPE", "OFPBRC_EPERM", "OFPBRC_BAD_LEN", "OFPBRC_BUFFER_EMPTY", "OFPBRC_BUFFER_UNKNOWN",
		"OFPBRC_BAD_TABLE_ID", "OFPBRC_IS_SLAVE", "OFPBRC_BAD_PORT", "OFPBRC_BAD_PACKET", "OFPBRC_MULTIPART_BUFFER_OVERFLOW"}},
	{"OFPET_BAD_ACTION", []string{"OFPBAC_BAD_TYPE", "OFPBAC_BAD_LEN", "OFPBAC_BAD_EXPERIMENTER", "OFPBAC_BAD_EXP_TYPE",
		"OFPBAC_BAD_OUT_PORT", "OFPBAC_BAD_ARGUMENT", "OFPBAC_EPERM", "OFPBAC_TOO_MANY", "OFPBAC_BAD_QUEUE",
		"OFPBAC_BAD_OUT_GROUP", "OFPBAC_MATCH_INCONSISTENT", "OFPBAC_UNSUPPORTED_ORDER", "OFPBAC_BAD_TAG",
		"OFPBAC_BAD_SET_TYPE", "OFPBAC_BAD_SET_LEN", "OFPBAC_BAD_SET_ARGUMENT"}},
	{"OFPET_BAD_INSTRUCTION", []string{"OFPBIC_UNKNOWN_INST", "OFPBIC_UNSUP_INST", "OFPBIC_BAD_TABLE_ID",
		"OFPBIC_UNSUP_METADATA", "OFPBIC_UNSUP_METADATA_MASK", "OFPBIC_BAD_EXPERIMENTER", "OFPBIC_BAD_EXP_TYPE",
		"OFPBIC_BAD_LEN", "OFPBIC_EPERM"}},
	{"OFPET_BAD_MATCH", []string{"OFPBMC_BAD_TYPE", "OFPBMC_BAD_LEN", "OFPBMC_BAD_TAG", "OFPBMC_BAD_DL_ADDR_MASK",
		"OFPBMC_BAD_NW_ADDR_MASK", "OFPBMC_BAD_WILDCARDS", "OFPBMC_BAD_FIELD", "OFPBMC_BAD_VALUE", "OFPBMC_BAD_MASK",
		"OFPBMC_BAD_PREREQ", "OFPBMC_DUP_FIELD", "OFPBMC_EPERM"}},
	{"OFPET_FLOW_MOD_FAILED", []string{"OFPFMFC_UNKNOWN", "OFPFMFC_TABLE_FULL", "OFPFMFC_BAD_TABLE_ID", "OFPFMFC_OVERLAP",
		"OFPFMFC_EPERM", "OFPFMFC_BAD_TIMEOUT", "OFPFMFC_BAD_COMMAND", "OFPFMFC_BAD_FLAGS"}},
	{"OFPET_GROUP_MOD_FAILED", []string{"OFPGMFC_GROUP_EXISTS", "OFPGMFC_INVALID_GROUP", "OFPGMFC_WEIGHT_UNSUPPORTED",
		"OFPGMFC_OUT_OF_GROUPS", "OFPGMFC_OUT_OF_BUCKETS", "OFPGMFC_CHAINING_UNSUPPORTED", "OFPGMFC_WATCH_UNSUPPORTED",
		"OFPGMFC_LOOP", "OFPGMFC_UNKNOWN_GROUP", "OFPGMFC_CHAINED_GROUP", "OFPGMFC_BAD_TYPE", "OFPGMFC_BAD_COMMAND",
		"OFPGMFC_BAD_BUCKET", "OFPGMFC_BAD_WATCH", "OFPGMFC_EPERM"}},
	{"OFPET_PORT_MOD_FAILED", []string{"OFPPMFC_BAD_PORT", "OFPPMFC_BAD_HW_ADDR", "OFPPMFC_BAD_CONFIG", "OFPPMFC_BAD_ADVERTISE", "OFPPMFC_EPERM"}},
	{"OFPET_TABLE_MOD_FAILED", []string{"OFPTMFC_BAD_TABLE", "OFPTMFC_BAD_CONFIG", "OFPTMFC_EPERM"}},
	{"OFPET_QUEUE_OP_FAILED", []string{"OFPQOFC_BAD_PORT", "OFPQOFC_BAD_QUEUE", "OFPQOFC_EPERM"}},
	{"OFPET_SWITCH_CONFIG_FAILED", []string{"OFPSCFC_BAD_FLAGS", "OFPSCFC_BAD_LEN", "OFPSCFC_EPERM"}},
	{"OFPET_ROLE_REQUEST_FAILED", []string{"OFPRRFC_STALE", "OFPRRFC_UNSUP", "OFPRRFC_BAD_ROLE"}},
	{"OFPET_METER_MOD_FAILED", []string{"OFPMMFC_UNKNOWN", "OFPMMFC_METER_EXISTS", "OFPMMFC_INVALID_METER", "OFPMMFC_UNKNOWN_METER",
		"OFPMMFC_BAD_COMMAND", "OFPMMFC_BAD_FLAGS", "OFPMMFC_BAD_RATE", "OFPMMFC_BAD_BURST", "OFPMMFC_BAD_BAND",
		"OFPMMFC_BAD_BAND_VALUE", "OFPMMFC_OUT_OF_METERS", "OFPMMFC_OUT_OF_BANDS"}},
	{"OFPET_TABLE_FEATURES_FAILED", []string{"OFPTFFC_BAD_TABLE", "OFPTFFC_BAD_METADATA", "OFPTFFC_BAD_TYPE", "OFPTFFC_BAD_LEN",
		"OFPTFFC_BAD_ARGUMENT", "OFPTFFC_EPERM"}},
}

// Bundle failures as OpenFlow 1.3's ONF extension numbers them (2300 + the OpenFlow 1.4 code).
var bundleFailedNames = []string{"OFPBFC_UNKNOWN", "OFPBFC_EPERM", "OFPBFC_BAD_ID", "OFPBFC_BUNDLE_EXIST",
	"OFPBFC_BUNDLE_CLOSED", "OFPBFC_OUT_OF_BUNDLES", "OFPBFC_BAD_TYPE", "OFPBFC_BAD_FLAGS", "OFPBFC_MSG_BAD_LEN",
	"OFPBFC_MSG_BAD_XID", "OFPBFC_MSG_UNSUP", "OFPBFC_MSG_CONFLICT", "OFPBFC_MSG_TOO_MANY", "OFPBFC_MSG_FAILED",
	"OFPBFC_TIMEOUT", "OFPBFC_BUNDLE_IN_PROGRESS"}
