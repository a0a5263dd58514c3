// Command ofsdn-testpod is the lab pods' process: `serve` answers on the pod's ports, `probe` tests a
// peer. See e2e/testpod.
//
//	ofsdn-testpod serve --name ns/pod --tcp 8080 --udp 8080 [--sctp 8080] [--networks 8081]
//	                                                    (--networks: TCP and UDP on each Network interface, net1..., bound to it)
//	ofsdn-testpod probe tcp|udp|sctp HOST:PORT [--payload 1400] [--timeout 2s] [--dev net1] [--sport 41234]
//	ofsdn-testpod probe-all [--timeout 1s] [--dev net1] tcp|udp|sctp/HOST:PORT...     (JSON result per target, all at once)
//	ofsdn-testpod repeat tcp|udp|sctp HOST:PORT [--want ns/pod] [--interval 10ms] [--timeout 500ms] [--duration 10s] [--dev net1]
//	                                                                                  (a new single-attempt connection per interval; JSON counts)
//	ofsdn-testpod spread tcp|udp HOST:PORT [--count 600] [--parallel 8] [--timeout 2s]   (JSON counts per endpoint)
//	ofsdn-testpod session tcp|udp HOST:PORT [--interval 100ms] [--timeout 1s] [--duration 10s]  (one connection, a line per question)
//	ofsdn-testpod udp-session HOST:PORT [--interval 200ms] [--duration 10s]          (one socket, a line per question)
//	ofsdn-testpod hello --name ns/pod HOST:PORT                   (at once: UDP "<name> <i>" at 0, 5 and 10 ms, then exit)
//	ofsdn-testpod clients tcp|udp HOST:PORT[,HOST:PORT…] --sources A,B,… [--count 50] [--parallel 16] [--timeout 2s]
//	                                                                  (JSON per source: endpoints and seen addresses)
//	ofsdn-testpod connect [--timeout=5s] [--protocol=tcp|udp|sctp] HOST:PORT     (as agnhost connect: exit 1 and
//	                                                                  TIMEOUT, REFUSED or OTHER on stderr)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ofsdn/ofsdn/e2e/testpod"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-testpod:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: ofsdn-testpod serve|probe (see the package doc)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		name := fs.String("name", "", "who this pod is")
		tcp := fs.String("tcp", "", "TCP ports")
		udp := fs.String("udp", "", "UDP ports")
		sctp := fs.String("sctp", "", "SCTP ports (answered in user space: INIT → INIT-ACK, see testpod/sctp.go)")
		networks := fs.Int("networks", 0, "a port to answer on each Network interface (net1...), bound to it")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *networks > 0 {
			go func() {
				if err := testpod.ServeNetworks(ctx, *name, *networks); err != nil {
					fmt.Fprintln(os.Stderr, "ofsdn-testpod:", err)
					os.Exit(1)
				}
			}()
		}
		sp, err := testpod.ParsePorts(*sctp)
		if err != nil {
			return err
		}
		tp, err := testpod.ParsePorts(*tcp)
		if err != nil {
			return err
		}
		up, err := testpod.ParsePorts(*udp)
		if err != nil {
			return err
		}
		if len(sp) > 0 {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			sctpErr := make(chan error, 1)
			go func() { sctpErr <- testpod.ServeSCTP(ctx, *name, sp) }()
			go func() {
				if err := <-sctpErr; err != nil {
					fmt.Fprintln(os.Stderr, "ofsdn-testpod:", err)
					os.Exit(1)
				}
			}()
		}
		return testpod.Serve(ctx, *name, tp, up)
	case "probe":
		fs := flag.NewFlagSet("probe", flag.ContinueOnError)
		payload := fs.Int("payload", 0, "TCP: bytes to send and expect echoed")
		timeout := fs.Duration("timeout", 2*time.Second, "give up after")
		fs.StringVar(&testpod.BindDevice, "dev", "", "send from this interface (SO_BINDTODEVICE)")
		fs.IntVar(&testpod.LocalPort, "sport", 0, "UDP: send from this source port")
		if len(args) < 3 {
			return fmt.Errorf("usage: probe tcp|udp HOST:PORT")
		}
		if err := fs.Parse(args[3:]); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		var rep testpod.Reply
		var err error
		switch args[1] {
		case "tcp":
			rep, err = testpod.ProbeTCP(ctx, args[2], *payload)
		case "udp":
			rep, err = testpod.ProbeUDP(ctx, args[2])
		case "sctp":
			rep, err = testpod.ProbeSCTP(ctx, args[2])
		default:
			return fmt.Errorf("probe %q: want tcp, udp or sctp", args[1])
		}
		if err != nil {
			return err
		}
		fmt.Println(rep)
		return nil
	case "spread":
		fs := flag.NewFlagSet("spread", flag.ContinueOnError)
		count := fs.Int("count", 100, "connections")
		parallel := fs.Int("parallel", 8, "at a time")
		timeout := fs.Duration("timeout", 2*time.Second, "per connection")
		if len(args) < 3 {
			return fmt.Errorf("usage: spread tcp|udp HOST:PORT")
		}
		if err := fs.Parse(args[3:]); err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(testpod.Spread(ctx, args[1], args[2], *count, *parallel, *timeout))
	case "clients":
		fs := flag.NewFlagSet("clients", flag.ContinueOnError)
		count := fs.Int("count", 50, "connections per source")
		parallel := fs.Int("parallel", 16, "at a time")
		timeout := fs.Duration("timeout", 2*time.Second, "per connection")
		sources := fs.String("sources", "", "source addresses (comma-separated); empty: the kernel's choice")
		if len(args) < 3 {
			return fmt.Errorf("usage: clients tcp|udp HOST:PORT[,HOST:PORT…] --sources A,B,…")
		}
		if err := fs.Parse(args[3:]); err != nil {
			return err
		}
		var srcs []netip.Addr
		for _, f := range strings.Split(*sources, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			a, err := netip.ParseAddr(f)
			if err != nil {
				return fmt.Errorf("--sources: %w", err)
			}
			srcs = append(srcs, a)
		}
		if len(srcs) == 0 {
			srcs = []netip.Addr{{}}
		}
		return json.NewEncoder(os.Stdout).Encode(testpod.Clients(ctx, args[1], strings.Split(args[2], ","), srcs, *count, *parallel, *timeout))
	case "probe-all":
		fs := flag.NewFlagSet("probe-all", flag.ContinueOnError)
		timeout := fs.Duration("timeout", time.Second, "per target")
		fs.StringVar(&testpod.BindDevice, "dev", "", "send from this interface (SO_BINDTODEVICE)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		var targets []testpod.Target
		for _, a := range fs.Args() {
			t, err := testpod.ParseTarget(a)
			if err != nil {
				return err
			}
			targets = append(targets, t)
		}
		return json.NewEncoder(os.Stdout).Encode(testpod.ProbeAll(ctx, targets, *timeout))
	case "repeat":
		fs := flag.NewFlagSet("repeat", flag.ContinueOnError)
		want := fs.String("want", "", "count only replies from this server (ns/pod)")
		interval := fs.Duration("interval", 10*time.Millisecond, "between connections")
		timeout := fs.Duration("timeout", 500*time.Millisecond, "per connection")
		duration := fs.Duration("duration", 10*time.Second, "how long")
		fs.StringVar(&testpod.BindDevice, "dev", "", "send from this interface (SO_BINDTODEVICE)")
		if len(args) < 3 {
			return fmt.Errorf("usage: repeat tcp|udp|sctp HOST:PORT")
		}
		if err := fs.Parse(args[3:]); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, *duration)
		defer cancel()
		return json.NewEncoder(os.Stdout).Encode(testpod.Repeat(ctx, args[1], args[2], *want, *interval, *timeout))
	case "session":
		fs := flag.NewFlagSet("session", flag.ContinueOnError)
		interval := fs.Duration("interval", 100*time.Millisecond, "between questions")
		timeout := fs.Duration("timeout", time.Second, "per question")
		duration := fs.Duration("duration", 10*time.Second, "how long")
		if len(args) < 3 {
			return fmt.Errorf("usage: session tcp|udp HOST:PORT")
		}
		if err := fs.Parse(args[3:]); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, *duration)
		defer cancel()
		return testpod.Session(ctx, args[1], args[2], *interval, *timeout, os.Stdout)
	case "connect":
		fs := flag.NewFlagSet("connect", flag.ContinueOnError)
		timeout := fs.Duration("timeout", 5*time.Second, "for the attempt")
		proto := fs.String("protocol", "tcp", "tcp, udp or sctp")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return fmt.Errorf("usage: connect [--timeout=5s] [--protocol=tcp] HOST:PORT")
		}
		msg, code := testpod.Connect(ctx, *proto, fs.Arg(0), *timeout)
		fmt.Fprint(os.Stderr, msg)
		os.Exit(code)
	case "udp-session":
		fs := flag.NewFlagSet("udp-session", flag.ContinueOnError)
		interval := fs.Duration("interval", 200*time.Millisecond, "between questions")
		duration := fs.Duration("duration", 10*time.Second, "how long")
		if len(args) < 2 {
			return fmt.Errorf("usage: udp-session HOST:PORT")
		}
		if err := fs.Parse(args[2:]); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, *duration)
		defer cancel()
		return testpod.UDPSession(ctx, args[1], *interval, os.Stdout)
	case "hello":
		// A pod's first packets, sent the moment its process starts (the node simulator runs it
		// right after CNI ADD returned): three datagrams within 10 ms, then the process exits.
		fs := flag.NewFlagSet("hello", flag.ContinueOnError)
		name := fs.String("name", "", "who this pod is")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return fmt.Errorf("usage: hello --name ns/pod HOST:PORT")
		}
		return testpod.Hello(*name, fs.Arg(0), 3, 5*time.Millisecond)
	}
	return fmt.Errorf("unknown command %q", args[0])
}
