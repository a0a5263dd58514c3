package openflow

import (
	"encoding/binary"
	"errors"
	"fmt"

	of "antrea.io/libOpenflow/openflow13"
)

// Messages of drop sampling: the meters that bound it, the asynchronous configuration that lets a
// connection receive packet-ins, and the packet-ins themselves.

// The packet-in's fixed part and reasons (the message types are wire.go's).
const (
	packetInFixed = 24 // header, buffer_id, total_len, reason, table_id, cookie
	reasonNoMatch = 0  // OFPR_NO_MATCH: what OpenFlow 1.3 calls a controller action of a table-miss flow
	reasonAction  = 1  // OFPR_ACTION: an output to the controller
)

// MeterModCommand is OFPMC_ADD, _MODIFY or _DELETE.
type MeterModCommand uint16

const (
	MeterAdd    MeterModCommand = of.OFPMC_ADD
	MeterModify MeterModCommand = of.OFPMC_MODIFY
	MeterDelete MeterModCommand = of.OFPMC_DELETE
)

// MeterBand is a meter with one drop band in packets per second: what passes is at most Rate
// packets/s on average, in bursts of at most Burst.
type MeterBand struct {
	ID    uint32
	Rate  uint32 // packets per second
	Burst uint32 // packets
}

func (m MeterBand) String() string {
	return fmt.Sprintf("meter=%d pktps burst stats bands=type=drop rate=%d burst_size=%d", m.ID, m.Rate, m.Burst)
}

// EncodeMeterMod lays out an OFPT_METER_MOD for m: flags pktps, burst and stats, one drop band.
func EncodeMeterMod(cmd MeterModCommand, m MeterBand, xid uint32) []byte {
	const n = HeaderLen + 8 + 16
	b := make([]byte, n)
	PutHeader(b, TypeMeterMod, n, xid)
	binary.BigEndian.PutUint16(b[8:], uint16(cmd))
	binary.BigEndian.PutUint16(b[10:], 0x2|0x4|0x8) // OFPMF_PKTPS | OFPMF_BURST | OFPMF_STATS
	binary.BigEndian.PutUint32(b[12:], m.ID)
	binary.BigEndian.PutUint16(b[16:], of.OFPMBT13_DROP)
	binary.BigEndian.PutUint16(b[18:], 16)
	binary.BigEndian.PutUint32(b[20:], m.Rate)
	binary.BigEndian.PutUint32(b[24:], m.Burst)
	return b
}

// IsMeterExists says whether err is OFPET_METER_MOD_FAILED / OFPMMFC_METER_EXISTS.
func IsMeterExists(err error) bool {
	var e *OFError
	return errors.As(err, &e) && e.Type == of.ET_METER_MOD_FAILED && e.Code == meterModFailedExists
}

// EncodeSetAsync lays out an OFPT_SET_ASYNC that asks for packet-ins of controller actions (in the
// master or equal role, which a connection has unless it asked for another) and for no port-status or
// flow-removed messages. Open vSwitch sends service connections (the bridge's management socket)
// no asynchronous message until asked. Both reasons: OVS reports the controller action of a table's
// miss flow (priority 0, no match: most tables' drops) as OFPR_NO_MATCH in OpenFlow 1.3.
func EncodeSetAsync(xid uint32) []byte {
	const n = HeaderLen + 24
	b := make([]byte, n)
	PutHeader(b, TypeSetAsync, n, xid)
	binary.BigEndian.PutUint32(b[8:], 1<<reasonAction|1<<reasonNoMatch) // packet_in_mask[master/equal]
	return b
}

// PacketIn is a packet-in as the switch sent it: the flow that sent it (table, cookie), the metadata
// OVS reports with it (in_port, tun_id, the tunnel source, registers) and the first bytes of the
// packet.
type PacketIn struct {
	Table    TableID
	Cookie   uint64
	Reason   uint8
	TotalLen uint16
	InPort   uint32
	TunID    uint64
	TunSrc   uint32 // IPv4, 0 when the packet did not come from a tunnel
	Regs     [8]uint32
	Data     []byte
}

// ParsePacketIn decodes an OpenFlow 1.3 OFPT_PACKET_IN. Metadata fields it does not know are skipped.
// Data aliases msg.
func ParsePacketIn(msg []byte) (PacketIn, error) {
	var p PacketIn
	if len(msg) < packetInFixed+4 {
		return p, fmt.Errorf("packet-in: %d bytes", len(msg))
	}
	if msg[1] != TypePacketIn {
		return p, fmt.Errorf("packet-in: a message of type %d", msg[1])
	}
	p.TotalLen = binary.BigEndian.Uint16(msg[12:])
	p.Reason = msg[14]
	p.Table = TableID(msg[15])
	p.Cookie = binary.BigEndian.Uint64(msg[16:])
	mlen := int(binary.BigEndian.Uint16(msg[packetInFixed+2:]))
	padded := (mlen + 7) / 8 * 8
	if mlen < 4 || packetInFixed+padded+2 > len(msg) {
		return p, fmt.Errorf("packet-in: match of %d bytes in a message of %d", mlen, len(msg))
	}
	for b := msg[packetInFixed+4 : packetInFixed+mlen]; len(b) > 0; {
		if len(b) < 4 || len(b) < 4+int(b[3]) {
			return p, errors.New("packet-in: truncated match field")
		}
		class, field, hasMask, n := binary.BigEndian.Uint16(b), b[2]>>1, b[2]&1 == 1, int(b[3])
		v := b[4 : 4+n]
		b = b[4+n:]
		if hasMask {
			continue
		}
		switch {
		case class == classBasic && field == 0 && n == 4: // OXM_OF_IN_PORT
			p.InPort = binary.BigEndian.Uint32(v)
		case class == classBasic && field == 38 && n == 8: // OXM_OF_TUNNEL_ID
			p.TunID = binary.BigEndian.Uint64(v)
		case class == classNXM1 && field <= 7 && n == 4: // NXM_NX_REG0..7
			p.Regs[field] = binary.BigEndian.Uint32(v)
		case class == classNXM1 && field == 31 && n == 4: // NXM_NX_TUN_IPV4_SRC
			p.TunSrc = binary.BigEndian.Uint32(v)
		}
	}
	p.Data = msg[packetInFixed+padded+2:]
	return p, nil
}
