package lab

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// arpReply is one answer to a who-has: the frame's Ethernet source and the ARP sender's MAC.
type arpReply struct {
	ethSrc, senderMAC string
}

// arpWhoHas broadcasts an ARP request for target from the interface ifname of namespace ns (with that
// interface's MAC and the source address src) and returns every reply for target that arrives within
// wait. A raw AF_PACKET socket sees each reply frame as it comes off the wire, before the kernel picks
// one for its neighbour table: exactly what a snooping ovs-vswitchd sees.
func arpWhoHas(ns, ifname string, src, target netip.Addr, wait time.Duration) ([]arpReply, error) {
	var fd int
	var ifi *net.Interface
	if err := InNetNS(ns, func() (err error) {
		if ifi, err = net.InterfaceByName(ifname); err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
		return err
	}); err != nil {
		return nil, fmt.Errorf("raw socket in %s: %w", ns, err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifi.Index}); err != nil {
		return nil, fmt.Errorf("bind to %s: %w", ifname, err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, err
	}
	broadcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	frame := make([]byte, 0, 42)
	frame = append(frame, broadcast...)
	frame = append(frame, ifi.HardwareAddr...)
	frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_ARP)
	frame = binary.BigEndian.AppendUint16(frame, 1)      // Ethernet
	frame = binary.BigEndian.AppendUint16(frame, 0x0800) // IPv4
	frame = append(frame, 6, 4)
	frame = binary.BigEndian.AppendUint16(frame, 1) // request
	frame = append(frame, ifi.HardwareAddr...)
	frame = append(frame, src.AsSlice()...)
	frame = append(frame, make([]byte, 6)...)
	frame = append(frame, target.AsSlice()...)
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifi.Index, Halen: 6}
	copy(to.Addr[:], broadcast)
	if err := unix.Sendto(fd, frame, 0, to); err != nil {
		return nil, fmt.Errorf("send who-has %s: %w", target, err)
	}
	var replies []arpReply
	buf := make([]byte, 1500)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			return nil, err
		}
		p := buf[:n]
		if len(p) < 42 || binary.BigEndian.Uint16(p[12:14]) != unix.ETH_P_ARP || binary.BigEndian.Uint16(p[20:22]) != 2 {
			continue
		}
		if !bytes.Equal(p[28:32], target.AsSlice()) {
			continue
		}
		replies = append(replies, arpReply{ethSrc: net.HardwareAddr(p[6:12]).String(), senderMAC: net.HardwareAddr(p[22:28]).String()})
	}
	return replies, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestARPAnsweredOnlyOnUnderlay: a node answers ARP for its underlay address once, with br-ul's MAC, as
// a host with one NIC does. Its kernel also sees every frame on the uplink eth0 (the userspace datapath
// reads eth0 through AF_PACKET, which does not take frames away from the stack), and by default Linux
// answers for any local address on any interface: a second reply with eth0's MAC would then race the
// right one, and a snooping ovs-vswitchd keeps whichever came last (shared/LAB.md, issue 10).
func TestARPAnsweredOnlyOnUnderlay(t *testing.T) {
	l := StartT(t, Options{Nodes: 2})
	for _, target := range l.Nodes {
		askers := []struct {
			name, ns, ifname string
			src              netip.Addr
		}{
			{"external", l.External.NetNS, Uplink, l.External.IP},
		}
		for _, n := range l.Nodes {
			if n != target {
				askers = append(askers, struct {
					name, ns, ifname string
					src              netip.Addr
				}{n.Name, n.NetNS, UnderlayBridge, n.IP})
			}
		}
		for _, a := range askers {
			// Several rounds: with two repliers the order varies, and one round may look right.
			for i := range 5 {
				replies, err := arpWhoHas(a.ns, a.ifname, a.src, target.IP, 300*time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				want := []arpReply{{ethSrc: target.MAC.String(), senderMAC: target.MAC.String()}}
				if !slices.Equal(replies, want) {
					t.Fatalf("%s asks who-has %s (round %d): replies %+v, want exactly %+v (br-ul's MAC)", a.name, target.IP, i, replies, want)
				}
			}
		}
	}
}
