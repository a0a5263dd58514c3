package testpod

// SCTP in user space. The lab's kernel has no SCTP module (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)
// fails with EPROTONOSUPPORT), but raw IP sockets of protocol 132 work, and what a network plugin sees of an
// SCTP association's start is its first two packets: INIT and INIT-ACK (RFC 9260 §5.1), as a TCP
// connection's is SYN and SYN-ACK. So a server answers every INIT to one of its ports with an INIT-ACK whose
// state cookie carries the usual reply ("<name> <client ip:port> <port>"), and an INIT to any other port
// with an ABORT (§8.4: out of the blue); a prober sends INITs until an INIT-ACK or ABORT comes back. Nothing
// else of SCTP is spoken: the association is never completed, as nothing here needs it to be.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"
)

const (
	sctpProtocol  = "ip4:132"
	chunkInit     = 1
	chunkInitAck  = 2
	chunkAbort    = 6
	paramCookie   = 7
	sctpHeaderLen = 12
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpPacket builds a packet of one chunk, with its CRC32c.
func sctpPacket(srcPort, dstPort uint16, vtag uint32, chunkType, flags byte, value []byte) []byte {
	chunkLen := 4 + len(value)
	pkt := make([]byte, sctpHeaderLen+(chunkLen+3)&^3)
	binary.BigEndian.PutUint16(pkt[0:], srcPort)
	binary.BigEndian.PutUint16(pkt[2:], dstPort)
	binary.BigEndian.PutUint32(pkt[4:], vtag)
	pkt[12], pkt[13] = chunkType, flags
	binary.BigEndian.PutUint16(pkt[14:], uint16(chunkLen))
	copy(pkt[16:], value)
	binary.LittleEndian.PutUint32(pkt[8:], crc32.Checksum(pkt, castagnoli))
	return pkt
}

// initValue is the fixed part of INIT and INIT-ACK: initiate tag, a_rwnd, streams, initial TSN.
func initValue(tag uint32) []byte {
	v := make([]byte, 16)
	binary.BigEndian.PutUint32(v[0:], tag)
	binary.BigEndian.PutUint32(v[4:], 65536)
	binary.BigEndian.PutUint16(v[8:], 1)
	binary.BigEndian.PutUint16(v[10:], 1)
	binary.BigEndian.PutUint32(v[12:], tag)
	return v
}

type sctpChunk struct {
	srcPort, dstPort uint16
	vtag             uint32
	typ, flags       byte
	value            []byte
}

// parseSCTP reads a packet's header and first chunk, checking its CRC32c.
func parseSCTP(pkt []byte) (sctpChunk, error) {
	if len(pkt) < sctpHeaderLen+4 {
		return sctpChunk{}, errors.New("short SCTP packet")
	}
	sum := binary.LittleEndian.Uint32(pkt[8:])
	check := slices.Clone(pkt)
	binary.LittleEndian.PutUint32(check[8:], 0)
	if crc32.Checksum(check, castagnoli) != sum {
		return sctpChunk{}, errors.New("bad SCTP checksum")
	}
	n := int(binary.BigEndian.Uint16(pkt[14:]))
	if n < 4 || sctpHeaderLen+n > len(pkt) {
		return sctpChunk{}, errors.New("bad SCTP chunk length")
	}
	return sctpChunk{srcPort: binary.BigEndian.Uint16(pkt[0:]), dstPort: binary.BigEndian.Uint16(pkt[2:]),
		vtag: binary.BigEndian.Uint32(pkt[4:]), typ: pkt[12], flags: pkt[13], value: pkt[16 : sctpHeaderLen+n]}, nil
}

// ServeSCTP answers INITs on ports until ctx ends.
func ServeSCTP(ctx context.Context, name string, ports []int) error {
	pc, err := net.ListenPacket(sctpProtocol, "0.0.0.0")
	if err != nil {
		return fmt.Errorf("testpod: sctp raw socket: %w", err)
	}
	go func() { <-ctx.Done(); pc.Close() }()
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf) // the IPv4 header is stripped
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("testpod: sctp: %w", err)
		}
		c, err := parseSCTP(buf[:n])
		if err != nil || c.typ != chunkInit || c.vtag != 0 || len(c.value) < 16 {
			continue // not an INIT (our own INIT-ACKs and probes' packets come by here too)
		}
		peerTag := binary.BigEndian.Uint32(c.value[0:])
		var reply []byte
		if slices.Contains(ports, int(c.dstPort)) {
			cookie := []byte(fmt.Sprintf("%s %s %d\n", name, net.JoinHostPort(from.String(), strconv.Itoa(int(c.srcPort))), c.dstPort))
			param := make([]byte, 4+len(cookie))
			binary.BigEndian.PutUint16(param[0:], paramCookie)
			binary.BigEndian.PutUint16(param[2:], uint16(len(param)))
			copy(param[4:], cookie)
			value := append(initValue(rand.Uint32()|1), param...)
			reply = sctpPacket(c.dstPort, c.srcPort, peerTag, chunkInitAck, 0, value)
		} else {
			reply = sctpPacket(c.dstPort, c.srcPort, peerTag, chunkAbort, 0, nil)
		}
		_, _ = pc.WriteTo(reply, from)
	}
}

// ProbeSCTP sends INITs to addr every 300 ms until an INIT-ACK (the reply in its cookie) or an ABORT
// ("refused") comes back, or ctx ends.
func ProbeSCTP(ctx context.Context, addr string) (Reply, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return Reply{}, fmt.Errorf("sctp %s: %w", addr, err)
	}
	pc, err := net.ListenPacket(sctpProtocol, "0.0.0.0")
	if err != nil {
		return Reply{}, fmt.Errorf("sctp %s: raw socket: %w", addr, err)
	}
	defer pc.Close()
	srcPort := uint16(32768 + rand.IntN(28000))
	tag := rand.Uint32() | 1
	initPkt := sctpPacket(srcPort, ap.Port(), 0, chunkInit, 0, initValue(tag))
	dst := &net.IPAddr{IP: ap.Addr().AsSlice()}
	buf := make([]byte, 65535)
	for {
		if _, err := pc.WriteTo(initPkt, dst); err != nil {
			return Reply{}, fmt.Errorf("sctp %s: send INIT: %w", addr, err)
		}
		resend := time.Now().Add(300 * time.Millisecond)
		for time.Now().Before(resend) {
			dl := resend
			if d, ok := ctx.Deadline(); ok && d.Before(dl) {
				dl = d
			}
			_ = pc.SetReadDeadline(dl)
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				if ctx.Err() != nil {
					return Reply{}, fmt.Errorf("sctp %s: no reply: %w", addr, ctx.Err())
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break
				}
				return Reply{}, fmt.Errorf("sctp %s: %w", addr, err)
			}
			c, err := parseSCTP(buf[:n])
			if err != nil || c.vtag != tag || c.srcPort != ap.Port() || c.dstPort != srcPort || from.String() != ap.Addr().String() {
				continue
			}
			switch c.typ {
			case chunkAbort:
				return Reply{}, fmt.Errorf("sctp %s: refused (ABORT)", addr)
			case chunkInitAck:
				for p := c.value[min(16, len(c.value)):]; len(p) >= 4; {
					typ, l := binary.BigEndian.Uint16(p[0:]), int(binary.BigEndian.Uint16(p[2:]))
					if l < 4 || l > len(p) {
						break
					}
					if typ == paramCookie {
						return parseReply(string(p[4:l]))
					}
					p = p[min((l+3)&^3, len(p)):]
				}
				return Reply{}, fmt.Errorf("sctp %s: INIT-ACK without a state cookie", addr)
			}
		}
		if ctx.Err() != nil {
			return Reply{}, fmt.Errorf("sctp %s: no reply: %w", addr, ctx.Err())
		}
	}
}
