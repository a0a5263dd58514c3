package testpod

import (
	"fmt"
	"net"
	"time"
)

// Hello sends count UDP datagrams "<name> <i>" to dst, interval apart, the first at once: what a pod
// that talks the moment it starts sends, for a test to see which source address its first packets had.
func Hello(name, dst string, count int, interval time.Duration) error {
	c, err := net.Dial("udp4", dst)
	if err != nil {
		return fmt.Errorf("hello %s: %w", dst, err)
	}
	defer c.Close()
	for i := range count {
		if i > 0 {
			time.Sleep(interval)
		}
		if _, err := fmt.Fprintf(c, "%s %d", name, i); err != nil {
			return fmt.Errorf("hello %s: %w", dst, err)
		}
	}
	return nil
}
