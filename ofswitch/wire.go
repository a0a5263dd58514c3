package ofswitch

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	of "antrea.io/libOpenflow/openflow13"
)

// OpenFlow 1.3 numbers, named after libOpenflow's codec where it has them.
const (
	ofVersion13 = of.VERSION

	typeHello          = of.Type_Hello
	typeError          = of.Type_Error
	typeEchoRequest    = of.Type_EchoRequest
	typeEchoReply      = of.Type_EchoReply
	typeExperimenter   = of.Type_Experimenter
	typeFeaturesReq    = of.Type_FeaturesRequest
	typeFeaturesReply  = of.Type_FeaturesReply
	typeMultipartReq   = of.Type_MultiPartRequest
	typeMultipartReply = of.Type_MultiPartReply
	typeBarrierReq     = of.Type_BarrierRequest
	typeBarrierReply   = of.Type_BarrierReply

	onfExperimenter  = of.ONF_EXPERIMENTER_ID
	onfBundleControl = of.Type_BundleCtrl
	onfBundleAdd     = of.Type_BundleAdd
	bundleFlags      = of.OFPBCT_ATOMIC | of.OFPBCT_ORDERED

	headerLen = 8
	// MaxMessageLen is the largest OpenFlow message (its length field has 16 bits).
	MaxMessageLen = 0xffff
	// bundleAddLen is the ONF bundle-add header that wraps every message of a bundle.
	bundleAddLen = 24
	// MaxBundledMessageLen is the largest message Bundle accepts: a bundle-add costs 16 bytes more.
	MaxBundledMessageLen = MaxMessageLen - (bundleAddLen - headerLen)

	bundleControlLen = 24
	multipartHdrLen  = 16
	portDescLen      = 64 // ofp_port in OpenFlow 1.3
)

// readMsg reads one complete message. A length shorter than a header is an error, never a panic;
// the stream cannot be resynchronised after it, so callers drop the connection.
func readMsg(r *bufio.Reader) ([]byte, error) {
	hdr, err := r.Peek(headerLen)
	if err != nil {
		if errors.Is(err, io.EOF) && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[2:]))
	if n < headerLen {
		return nil, fmt.Errorf("message type %d declares length %d, shorter than its %d-byte header", hdr[1], n, headerLen)
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

func msgXID(msg []byte) uint32 { return binary.BigEndian.Uint32(msg[4:]) }

// putHeader writes an OpenFlow 1.3 header into b.
func putHeader(b []byte, typ uint8, length int, xid uint32) {
	b[0], b[1] = ofVersion13, typ
	binary.BigEndian.PutUint16(b[2:], uint16(length))
	binary.BigEndian.PutUint32(b[4:], xid)
}

func headerOnly(typ uint8, xid uint32) []byte {
	b := make([]byte, headerLen)
	putHeader(b, typ, headerLen, xid)
	return b
}

// hello13 offers exactly OpenFlow 1.3: the header's version and a version bitmap with only bit 4.
// (libOpenflow's common.NewHello encodes a bitmap OVS rejects as OFPHFC_INCOMPATIBLE.)
func hello13(xid uint32) []byte {
	b := []byte{ofVersion13, typeHello, 0, 16, 0, 0, 0, 0, 0, 1, 0, 8, 0, 0, 0, 1 << ofVersion13}
	binary.BigEndian.PutUint32(b[4:], xid)
	return b
}

// checkHello reads the switch's hello: OpenFlow 1.3 must be in its version bitmap when it sends one,
// else its header version must be at least 1.3 (the negotiated version is the lower of the two).
func checkHello(msg []byte) error {
	if len(msg) < headerLen {
		return errors.New("hello shorter than a header")
	}
	body := msg[headerLen:]
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
				if v == ofVersion13 {
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
	if msg[0] < ofVersion13 {
		return fmt.Errorf("%w: the switch speaks wire version %d at most, not 4 (OpenFlow 1.3)", ErrVersion, msg[0])
	}
	return nil
}

// checkMessage validates one complete message given to Bundle or Send.
func checkMessage(m []byte, max int) error {
	if len(m) < headerLen {
		return fmt.Errorf("%d bytes are shorter than an OpenFlow header", len(m))
	}
	if len(m) > max {
		return fmt.Errorf("%d bytes exceed the %d an OpenFlow message may have here", len(m), max)
	}
	if n := int(binary.BigEndian.Uint16(m[2:])); n != len(m) {
		return fmt.Errorf("length field says %d bytes, the message has %d", n, len(m))
	}
	if m[0] != ofVersion13 {
		return fmt.Errorf("wire version %d, not 4 (OpenFlow 1.3)", m[0])
	}
	return nil
}

// appendBundleControl appends an ONF bundle-control message (OpenFlow 1.3 extension 2300).
func appendBundleControl(b []byte, id uint32, typ uint16, xid uint32) []byte {
	var m [bundleControlLen]byte
	putHeader(m[:], typeExperimenter, bundleControlLen, xid)
	binary.BigEndian.PutUint32(m[8:], onfExperimenter)
	binary.BigEndian.PutUint32(m[12:], onfBundleControl)
	binary.BigEndian.PutUint32(m[16:], id)
	binary.BigEndian.PutUint16(m[20:], typ)
	binary.BigEndian.PutUint16(m[22:], bundleFlags)
	return append(b, m[:]...)
}

// putBundleAdd fills the bundle-add header that precedes a message of msgLen bytes.
func putBundleAdd(h *[bundleAddLen]byte, id uint32, msgLen int, xid uint32) {
	putHeader(h[:], typeExperimenter, bundleAddLen+msgLen, xid)
	binary.BigEndian.PutUint32(h[8:], onfExperimenter)
	binary.BigEndian.PutUint32(h[12:], onfBundleAdd)
	binary.BigEndian.PutUint32(h[16:], id)
	binary.BigEndian.PutUint16(h[20:], 0) // pad
	binary.BigEndian.PutUint16(h[22:], bundleFlags)
}

// bundleReply reports whether msg is a bundle-control reply of the given type (OFPBCT_*_REPLY).
func bundleReply(msg []byte, typ uint16) bool {
	return len(msg) >= bundleControlLen && msg[1] == typeExperimenter &&
		binary.BigEndian.Uint32(msg[8:]) == onfExperimenter &&
		binary.BigEndian.Uint32(msg[12:]) == onfBundleControl &&
		binary.BigEndian.Uint16(msg[20:]) == typ
}

// multipartRequest builds an OFPT_MULTIPART_REQUEST of the given type and body.
func multipartRequest(typ uint16, body []byte, xid uint32) []byte {
	req := make([]byte, multipartHdrLen+len(body))
	putHeader(req, typeMultipartReq, len(req), xid)
	binary.BigEndian.PutUint16(req[8:], typ)
	copy(req[multipartHdrLen:], body)
	return req
}

// multipartChunk checks one OFPT_MULTIPART_REPLY and returns its body and whether more chunks follow.
func multipartChunk(msg []byte, typ uint16) (body []byte, more bool, err error) {
	if len(msg) < multipartHdrLen {
		return nil, false, fmt.Errorf("multipart reply of %d bytes is shorter than its %d-byte header", len(msg), multipartHdrLen)
	}
	if got := binary.BigEndian.Uint16(msg[8:]); got != typ {
		return nil, false, fmt.Errorf("multipart reply of type %d to a request of type %d", got, typ)
	}
	return msg[multipartHdrLen:], binary.BigEndian.Uint16(msg[10:])&of.OFPMPF_REPLY_MORE != 0, nil
}

// splitEntries cuts a multipart reply body into entries that start with their own 16-bit length
// (ofp_flow_stats, ofp_group_desc, ofp_group_stats). The entries share body's memory.
func splitEntries(body []byte, minLen int, entries [][]byte) ([][]byte, error) {
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
