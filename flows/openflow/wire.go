package openflow

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	of "antrea.io/libOpenflow/openflow13"
)

// OpenFlow 1.3 numbers, named after libOpenflow's codec where it has them: every protocol constant
// ofsdn uses is named here (or, for the fixed layout of the messages the codec writes itself, at the
// top of codec.go), once.
const (
	Version = of.VERSION

	TypeHello            = of.Type_Hello
	TypeError            = of.Type_Error
	TypeEchoRequest      = of.Type_EchoRequest
	TypeEchoReply        = of.Type_EchoReply
	TypeExperimenter     = of.Type_Experimenter
	TypeFeaturesRequest  = of.Type_FeaturesRequest
	TypeFeaturesReply    = of.Type_FeaturesReply
	TypeMultipartRequest = of.Type_MultiPartRequest
	TypeMultipartReply   = of.Type_MultiPartReply
	TypeBarrierRequest   = of.Type_BarrierRequest
	TypeBarrierReply     = of.Type_BarrierReply
	TypeFlowMod          = of.Type_FlowMod
	TypeGroupMod         = of.Type_GroupMod
	TypePacketIn         = of.Type_PacketIn
	TypeSetAsync         = of.Type_SetAsync
	TypeMeterMod         = of.Type_MeterMod
	// meterModFailedExists is OFPET_METER_MOD_FAILED's OFPMMFC_METER_EXISTS (libOpenflow has no name).
	meterModFailedExists = 1

	// Experimenter IDs: the ONF's (bundles, tcp_flags) and Nicira's (Open vSwitch's extensions).
	ONFExperimenter = of.ONF_EXPERIMENTER_ID
	nxExperimenter  = of.NxExperimenterID
	// ErrorTypeExperimenter is an OFPT_ERROR whose code is an experimenter's own (the bundles' OFPBFC_*).
	ErrorTypeExperimenter = of.ET_EXPERIMENTER

	onfBundleControl = of.Type_BundleCtrl
	onfBundleAdd     = of.Type_BundleAdd
	bundleFlags      = of.OFPBCT_ATOMIC | of.OFPBCT_ORDERED
	// Bundle-control types (OFPBCT_*) a session sends and waits for.
	BundleOpenRequest    = of.OFPBCT_OPEN_REQUEST
	BundleOpenReply      = of.OFPBCT_OPEN_REPLY
	BundleCommitRequest  = of.OFPBCT_COMMIT_REQUEST
	BundleCommitReply    = of.OFPBCT_COMMIT_REPLY
	BundleDiscardRequest = of.OFPBCT_DISCARD_REQUEST
	BundleDiscardReply   = of.OFPBCT_DISCARD_REPLY

	// Action and instruction types the codec lays out or decodes itself.
	actionOutput       = of.ActionType_Output
	actionGroup        = of.ActionType_Group
	actionDecNwTTL     = of.ActionType_DecNwTtl
	actionSetField     = of.ActionType_SetField
	actionExperimenter = of.ActionType_Experimenter
	instrGotoTable     = of.InstrType_GOTO_TABLE
	instrApplyActions  = of.InstrType_APPLY_ACTIONS

	HeaderLen = 8
	// MaxMessageLen is the largest OpenFlow message (its length field has 16 bits).
	MaxMessageLen = 0xffff
	// BundleAddLen is the ONF bundle-add header that wraps every message of a bundle.
	BundleAddLen = 24
	// MaxBundledMessageLen is the largest message Bundle accepts: a bundle-add costs 16 bytes more.
	MaxBundledMessageLen = MaxMessageLen - (BundleAddLen - HeaderLen)

	BundleControlLen = 24
	multipartHdrLen  = 16
	PortDescLen      = 64 // ofp_port in OpenFlow 1.3
)

// ReadMessage reads one complete message. A length shorter than a header is an error, never a panic;
// the stream cannot be resynchronised after it, so callers drop the connection.
func ReadMessage(r *bufio.Reader) ([]byte, error) {
	hdr, err := r.Peek(HeaderLen)
	if err != nil {
		if errors.Is(err, io.EOF) && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[2:]))
	if n < HeaderLen {
		return nil, fmt.Errorf("message type %d declares length %d, shorter than its %d-byte header", hdr[1], n, HeaderLen)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("message type %d of %d bytes: %w", msg[1], n, err)
	}
	return msg, nil
}

// XID is a message's transaction ID.
func XID(msg []byte) uint32 { return binary.BigEndian.Uint32(msg[4:]) }

// SetXID sets a complete message's transaction ID in place.
func SetXID(msg []byte, xid uint32) { binary.BigEndian.PutUint32(msg[4:], xid) }

// PutHeader writes an OpenFlow 1.3 header into b.
func PutHeader(b []byte, typ uint8, length int, xid uint32) {
	b[0], b[1] = Version, typ
	binary.BigEndian.PutUint16(b[2:], uint16(length))
	binary.BigEndian.PutUint32(b[4:], xid)
}

func HeaderOnly(typ uint8, xid uint32) []byte {
	b := make([]byte, HeaderLen)
	PutHeader(b, typ, HeaderLen, xid)
	return b
}

// Hello13 offers exactly OpenFlow 1.3: the header's version and a version bitmap with only bit 4.
// (libOpenflow's common.NewHello encodes a bitmap OVS rejects as OFPHFC_INCOMPATIBLE.)
func Hello13(xid uint32) []byte {
	b := []byte{Version, TypeHello, 0, 16, 0, 0, 0, 0, 0, 1, 0, 8, 0, 0, 0, 1 << Version}
	binary.BigEndian.PutUint32(b[4:], xid)
	return b
}

// CheckHello reads the switch's hello: OpenFlow 1.3 must be in its version bitmap when it sends one,
// else its header version must be at least 1.3 (the negotiated version is the lower of the two).
func CheckHello(msg []byte) error {
	if len(msg) < HeaderLen {
		return errors.New("hello shorter than a header")
	}
	body := msg[HeaderLen:]
	for len(body) >= 4 {
		typ, n := binary.BigEndian.Uint16(body), int(binary.BigEndian.Uint16(body[2:]))
		if n < 4 || n > len(body) {
			return fmt.Errorf("hello element of length %d with %d bytes left", n, len(body))
		}
		if typ == 1 { // OFPHET_VERSIONBITMAP
			var offered []int
			for i := 4; i+4 <= n; i += 4 {
				bits := binary.BigEndian.Uint32(body[i:])
				for v := 0; v < 32; v++ {
					if bits&(1<<v) != 0 {
						offered = append(offered, (i-4)*8+v)
					}
				}
			}
			for _, v := range offered {
				if v == Version {
					return nil
				}
			}
			return fmt.Errorf("%w: the switch offers wire versions %v, not 4 (OpenFlow 1.3); set protocols=OpenFlow13 on the bridge", ErrVersion, offered)
		}
		step := (n + 7) / 8 * 8 // elements are padded to 8 bytes
		if step > len(body) {
			break
		}
		body = body[step:]
	}
	if msg[0] < Version {
		return fmt.Errorf("%w: the switch speaks wire version %d at most, not 4 (OpenFlow 1.3)", ErrVersion, msg[0])
	}
	return nil
}

// CheckMessage validates one complete message given to Bundle or Send.
func CheckMessage(m []byte, max int) error {
	if len(m) < HeaderLen {
		return fmt.Errorf("%d bytes are shorter than an OpenFlow header", len(m))
	}
	if len(m) > max {
		return fmt.Errorf("%d bytes exceed the %d an OpenFlow message may have here", len(m), max)
	}
	if n := int(binary.BigEndian.Uint16(m[2:])); n != len(m) {
		return fmt.Errorf("length field says %d bytes, the message has %d", n, len(m))
	}
	if m[0] != Version {
		return fmt.Errorf("wire version %d, not 4 (OpenFlow 1.3)", m[0])
	}
	return nil
}

// AppendBundleControl appends an ONF bundle-control message (OpenFlow 1.3 extension 2300).
func AppendBundleControl(b []byte, id uint32, typ uint16, xid uint32) []byte {
	var m [BundleControlLen]byte
	PutHeader(m[:], TypeExperimenter, BundleControlLen, xid)
	binary.BigEndian.PutUint32(m[8:], ONFExperimenter)
	binary.BigEndian.PutUint32(m[12:], onfBundleControl)
	binary.BigEndian.PutUint32(m[16:], id)
	binary.BigEndian.PutUint16(m[20:], typ)
	binary.BigEndian.PutUint16(m[22:], bundleFlags)
	return append(b, m[:]...)
}

// PutBundleAdd fills the bundle-add header that precedes a message of msgLen bytes.
func PutBundleAdd(h *[BundleAddLen]byte, id uint32, msgLen int, xid uint32) {
	PutHeader(h[:], TypeExperimenter, BundleAddLen+msgLen, xid)
	binary.BigEndian.PutUint32(h[8:], ONFExperimenter)
	binary.BigEndian.PutUint32(h[12:], onfBundleAdd)
	binary.BigEndian.PutUint32(h[16:], id)
	binary.BigEndian.PutUint16(h[20:], 0) // pad
	binary.BigEndian.PutUint16(h[22:], bundleFlags)
}

// IsBundleReply reports whether msg is a bundle-control reply of the given type (OFPBCT_*_REPLY).
func IsBundleReply(msg []byte, typ uint16) bool {
	return len(msg) >= BundleControlLen && msg[1] == TypeExperimenter &&
		binary.BigEndian.Uint32(msg[8:]) == ONFExperimenter &&
		binary.BigEndian.Uint32(msg[12:]) == onfBundleControl &&
		binary.BigEndian.Uint16(msg[20:]) == typ
}

// MultipartRequest builds an OFPT_MULTIPART_REQUEST of the given type and body.
func MultipartRequest(typ uint16, body []byte, xid uint32) []byte {
	req := make([]byte, multipartHdrLen+len(body))
	PutHeader(req, TypeMultipartRequest, len(req), xid)
	binary.BigEndian.PutUint16(req[8:], typ)
	copy(req[multipartHdrLen:], body)
	return req
}

// MultipartChunk checks one OFPT_MULTIPART_REPLY and returns its body and whether more chunks follow.
func MultipartChunk(msg []byte, typ uint16) (body []byte, more bool, err error) {
	if len(msg) < multipartHdrLen {
		return nil, false, fmt.Errorf("multipart reply of %d bytes is shorter than its %d-byte header", len(msg), multipartHdrLen)
	}
	if got := binary.BigEndian.Uint16(msg[8:]); got != typ {
		return nil, false, fmt.Errorf("multipart reply of type %d to a request of type %d", got, typ)
	}
	return msg[multipartHdrLen:], binary.BigEndian.Uint16(msg[10:])&of.OFPMPF_REPLY_MORE != 0, nil
}

// SplitEntries cuts a multipart reply body into entries that start with their own 16-bit length
// (ofp_flow_stats, ofp_group_desc, ofp_group_stats). The entries share body's memory.
func SplitEntries(body []byte, minLen int, entries [][]byte) ([][]byte, error) {
	for len(body) > 0 {
		if len(body) < 2 {
			return entries, fmt.Errorf("multipart reply: %d stray bytes after the last entry", len(body))
		}
		n := int(binary.BigEndian.Uint16(body))
		if n < minLen || n > len(body) {
			return entries, fmt.Errorf("multipart reply: entry of length %d (at least %d) with %d bytes left", n, minLen, len(body))
		}
		entries = append(entries, body[:n:n])
		body = body[n:]
	}
	return entries, nil
}

// Multipart types the session requests (OpenFlow 1.3 §7.3.5).
const (
	MultipartFlow      = of.MultipartType_Flow
	MultipartGroup     = of.MultipartType_Group
	MultipartGroupDesc = of.MultipartType_GroupDesc
	MultipartPortDesc  = of.MultipartType_PortDesc
)

// Minimum entry lengths of multipart replies: fixed part plus the smallest match (OpenFlow 1.3 §7.3.5).
const (
	MinFlowStats  = 56
	MinGroupDesc  = 8
	MinGroupStats = 40
)

// FlowStatsRequest is the body of an OFPMP_FLOW request for the flows of table (AllTables: every
// table) whose cookie matches cookie/mask (mask 0: any cookie).
func FlowStatsRequest(table TableID, cookie, mask uint64) []byte {
	body := make([]byte, 40)
	body[0] = byte(table)
	binary.BigEndian.PutUint32(body[4:], PortAny)     // out_port
	binary.BigEndian.PutUint32(body[8:], ofpGroupAny) // out_group
	binary.BigEndian.PutUint64(body[16:], cookie)
	binary.BigEndian.PutUint64(body[24:], mask)
	binary.BigEndian.PutUint16(body[32:], 1) // an empty OXM match
	binary.BigEndian.PutUint16(body[34:], 4)
	return body
}

// GroupStatsRequest is the body of an OFPMP_GROUP request for every group.
func GroupStatsRequest() []byte {
	body := make([]byte, 8)
	binary.BigEndian.PutUint32(body, GroupAllID)
	return body
}

// Port is one ofp_port of a port description.
type Port struct {
	No     uint32 // OpenFlow port number (OFPP_LOCAL 0xfffffffe for the bridge's own port)
	Name   string
	HWAddr net.HardwareAddr
	Config uint32 // OFPPC_* bits
	State  uint32 // OFPPS_* bits
}

// ParsePort parses one PortDescLen-byte ofp_port.
func ParsePort(e []byte) (Port, error) {
	if len(e) < PortDescLen {
		return Port{}, fmt.Errorf("port description of %d bytes, want %d", len(e), PortDescLen)
	}
	name := e[16:32]
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	return Port{
		No:     binary.BigEndian.Uint32(e),
		HWAddr: net.HardwareAddr(append([]byte(nil), e[8:14]...)),
		Name:   string(name),
		Config: binary.BigEndian.Uint32(e[32:]),
		State:  binary.BigEndian.Uint32(e[36:]),
	}, nil
}

// FeaturesDatapathID reads the datapath ID of an OFPT_FEATURES_REPLY.
func FeaturesDatapathID(msg []byte) (uint64, error) {
	if len(msg) < HeaderLen+8 {
		return 0, fmt.Errorf("features reply of %d bytes", len(msg))
	}
	return binary.BigEndian.Uint64(msg[HeaderLen:]), nil
}
