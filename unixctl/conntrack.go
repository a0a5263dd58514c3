package unixctl

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ConntrackEntry is one connection of ovs-vswitchd's conntrack (the userspace one, or the kernel's
// through the kernel datapath) as dpctl/dump-conntrack prints it: its protocol, both directions' tuples
// (ports 0 for protocols without them) and its zone.
type ConntrackEntry struct {
	Protocol    uint8
	Orig, Reply Tuple
	Zone        uint16
}

// Tuple is one direction of a connection.
type Tuple struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

// Conntrack lists the connections in one conntrack zone (dpctl/dump-conntrack zone=N).
func (c *Client) Conntrack(ctx context.Context, zone uint16) ([]ConntrackEntry, error) {
	out, err := c.Call(ctx, "dpctl/dump-conntrack", "zone="+strconv.Itoa(int(zone)))
	if err != nil {
		return nil, err
	}
	return ParseConntrack(out)
}

var protocolNumbers = map[string]uint8{"icmp": 1, "tcp": 6, "udp": 17, "icmp6": 58, "sctp": 132}

// ParseConntrack reads dpctl/dump-conntrack's lines, e.g.
//
//	udp,orig=(src=10.128.0.5,dst=172.30.0.10,sport=40000,dport=53),reply=(src=10.128.2.7,dst=10.128.0.5,sport=8080,dport=40000),zone=65520
//
// A line it cannot read is an error that quotes it; fields it does not know (mark, labels, status,
// timeout, ICMP's id/type/code) are skipped.
func ParseConntrack(out string) ([]ConntrackEntry, error) {
	var entries []ConntrackEntry
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		e, err := parseConntrackLine(line)
		if err != nil {
			return nil, fmt.Errorf("unixctl: conntrack entry %q: %w", line, err)
		}
		entries = append(entries, e)
	}
	return entries, nil
}

func parseConntrackLine(line string) (ConntrackEntry, error) {
	var e ConntrackEntry
	proto, rest, ok := strings.Cut(line, ",")
	if !ok {
		return e, fmt.Errorf("no fields")
	}
	if n, known := protocolNumbers[proto]; known {
		e.Protocol = n
	} else if n, err := strconv.ParseUint(proto, 10, 8); err == nil {
		e.Protocol = uint8(n)
	} else {
		return e, fmt.Errorf("protocol %q", proto)
	}
	seen := 0
	for rest != "" {
		var field string
		if i := strings.IndexByte(rest, '('); i >= 0 && (strings.IndexByte(rest, ',') < 0 || i < strings.IndexByte(rest, ',')) {
			j := strings.IndexByte(rest, ')')
			if j < i {
				return e, fmt.Errorf("unbalanced parentheses")
			}
			field, rest = rest[:j+1], strings.TrimPrefix(rest[j+1:], ",")
		} else {
			field, rest, _ = strings.Cut(rest, ",")
		}
		key, val, _ := strings.Cut(field, "=")
		switch key {
		case "orig", "reply":
			t, err := parseTuple(strings.TrimSuffix(strings.TrimPrefix(val, "("), ")"))
			if err != nil {
				return e, fmt.Errorf("%s: %w", key, err)
			}
			if key == "orig" {
				e.Orig = t
			} else {
				e.Reply = t
			}
			seen++
		case "zone":
			z, err := strconv.ParseUint(val, 10, 16)
			if err != nil {
				return e, fmt.Errorf("zone %q", val)
			}
			e.Zone = uint16(z)
		}
	}
	if seen != 2 {
		return e, fmt.Errorf("want orig and reply tuples")
	}
	return e, nil
}

func parseTuple(s string) (Tuple, error) {
	var t Tuple
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		var err error
		switch k {
		case "src":
			t.Src, err = netip.ParseAddr(v)
		case "dst":
			t.Dst, err = netip.ParseAddr(v)
		case "sport", "dport":
			var p uint64
			if p, err = strconv.ParseUint(v, 10, 16); err == nil {
				if k == "sport" {
					t.SrcPort = uint16(p)
				} else {
					t.DstPort = uint16(p)
				}
			}
		}
		if err != nil {
			return t, fmt.Errorf("%s=%q", k, v)
		}
	}
	if !t.Src.IsValid() || !t.Dst.IsValid() {
		return t, fmt.Errorf("no src or dst")
	}
	return t, nil
}
