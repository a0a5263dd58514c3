package drops

import (
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
)

// FuzzPacketIn feeds arbitrary messages through what the sampler does with a packet-in (parse, then
// decode against a snapshot): a short or garbage message is counted as lost, never a panic.
func FuzzPacketIn(f *testing.F) {
	f.Add(packetIn(pipeline.TableIngressIsolation, 1, 3, 0, map[int]uint32{1: 5, 2: 7}, frame("10.128.0.3", "10.128.0.4", openflow.IPProtoTCP, 1234, 80)))
	f.Add(packetIn(pipeline.TableTunnelIngress, 2, 1, 0x100, nil, frame6("fe80::1", "ff02::2")))
	f.Add(packetIn(pipeline.TablePodIngress, 0, 3, 0, nil, []byte{0, 1, 2}))
	f.Add([]byte{})
	f.Add([]byte{4})
	f.Add([]byte{4, openflow.TypePacketIn, 0, 8})
	snap := testSnapshot()
	f.Fuzz(func(t *testing.T, msg []byte) {
		pin, err := openflow.ParsePacketIn(msg)
		if err != nil {
			return
		}
		if d, ok := Decode(pin, snap, time.Time{}); ok && d.Cause == "" {
			t.Fatalf("a drop record without a cause: %+v", d)
		}
	})
}

// FuzzParsePacket: any frame, however short or malformed, parses without a panic.
func FuzzParsePacket(f *testing.F) {
	f.Add(frame("10.128.0.3", "10.128.0.4", openflow.IPProtoUDP, 53, 53))
	f.Add(frame6("fe80::1", "ff02::2"))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0x00, 0, 0, 0x08, 0x00, 0x4f})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePacket(b)
		if err == nil && p.Src.IsValid() && !p.Src.Is4() && !p.Src.Is6() {
			t.Fatalf("invalid source %v", p.Src)
		}
	})
}
