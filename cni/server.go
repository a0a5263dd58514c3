package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/go-logr/logr"
)

// Handler is the agent's side of the CNI verbs.
type Handler interface {
	Add(ctx context.Context, req *Request) (*current.Result, error)
	Del(ctx context.Context, req *Request) error
	Check(ctx context.Context, req *Request) error
	// Status reports whether ADDs can be served now (nil: ready). A *types.Error with code 51 says
	// existing pods may have limited connectivity too; any other error means 50.
	Status(ctx context.Context) error
	// GC releases what belongs to attachments the runtime no longer lists as valid.
	GC(ctx context.Context, valid []Attachment) error
}

// Attachment is a (container ID, interface) pair a runtime still uses.
type Attachment struct{ ContainerID, IfName string }

// Server serves the plugin on a unix socket only root may open. The protocol is one JSON Request per
// connection, answered by one JSON Response; a request with Ack set is first confirmed with a Response
// that has only Accepted set, before any work. The plugin's hanging up cancels the request, and a
// request whose plugin left before it was confirmed (an agent that froze, and thawed to find requests
// their runtimes have given up on) is dropped unserved: the runtime has moved on, and serving an old
// DEL after a newer ADD of the same sandbox would break it. No HTTP: the
// plugin is exec'd for every pod, and without net/http (and klog) it starts in 20% less CPU, which is
// what ten pods starting at once queue on.
type Server struct {
	Socket  string
	Handler Handler
	Logger  logr.Logger
	ln      net.Listener
}

// requestReadTimeout bounds how long a connected plugin may take to send its request.
const requestReadTimeout = 10 * time.Second

// shutdownGrace is how long Serve waits for requests in flight once its context ends.
const shutdownGrace = 5 * time.Second

// Listen creates the socket (replacing a stale one) with mode 0600 in a 0700 directory.
func (s *Server) Listen() error {
	if err := os.MkdirAll(filepath.Dir(s.Socket), 0o700); err != nil {
		return fmt.Errorf("cni server: %w", err)
	}
	if err := os.Remove(s.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cni server: remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		return fmt.Errorf("cni server: %w", err)
	}
	if err := os.Chmod(s.Socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("cni server: %w", err)
	}
	s.ln = ln
	return nil
}

// Serve serves until ctx ends, then waits up to shutdownGrace for the requests in flight.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	defer stop()
	var inFlight sync.WaitGroup
	defer func() {
		done := make(chan struct{})
		go func() { inFlight.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(shutdownGrace):
			s.log().Info("CNI requests still running at shutdown")
		}
	}()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("cni server: accept: %w", err)
		}
		inFlight.Go(func() { s.serveConn(ctx, conn) })
	}
}

func (s *Server) log() logr.Logger {
	if s.Logger.GetSink() == nil {
		return logr.Discard()
	}
	return s.Logger
}

// serveConn answers one request. A request keeps running when the agent shuts down (the pod must not be
// left half-plumbed) but ends when the plugin goes away (the runtime gave up on it).
func (s *Server) serveConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	start := time.Now()
	req := &Request{}
	resp := &Response{}
	_ = conn.SetReadDeadline(start.Add(requestReadTimeout))
	enc := json.NewEncoder(conn)
	if err := json.NewDecoder(io.LimitReader(conn, maxMessage)).Decode(req); err != nil {
		resp.Error = Errorf(ErrDecoding, "ofsdn agent: malformed request: %v", err)
	} else {
		_ = conn.SetReadDeadline(time.Time{})
		if req.Ack {
			// A write to a unix socket whose peer closed fails at once (EPIPE): the plugin is gone.
			_ = conn.SetWriteDeadline(time.Now().Add(requestReadTimeout))
			if err := enc.Encode(&Response{Accepted: true}); err != nil {
				s.log().Info("CNI request dropped: its plugin left before the agent read it", "command", req.Command,
					"containerID", req.ContainerID, "waited", time.Since(start), "err", err)
				return
			}
			_ = conn.SetWriteDeadline(time.Time{})
		}
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		// The plugin sends nothing after its request (but perhaps the encoder's newline): a read fails
		// only when it hangs up, or when this function closes the connection.
		go func() {
			var b [64]byte
			for {
				if _, err := conn.Read(b[:]); err != nil {
					cancel()
					return
				}
			}
		}()
		resp = s.dispatch(rctx, req)
		cancel()
	}
	log := s.log().WithValues("command", req.Command, "containerID", req.ContainerID, "pod", req.PodNamespace()+"/"+req.PodName(),
		"duration", time.Since(start))
	if resp.Error != nil {
		log.Info("CNI request failed", "code", resp.Error.Code, "err", resp.Error.Msg)
	} else {
		log.V(2).Info("CNI request served")
	}
	if err := enc.Encode(resp); err != nil {
		log.Info("CNI answer not delivered (the plugin went away)", "err", err)
	}
}

func (s *Server) dispatch(ctx context.Context, req *Request) *Response {
	resp := &Response{}
	var err error
	switch req.Command {
	case CmdAdd:
		var res *current.Result
		if res, err = s.Handler.Add(ctx, req); err == nil {
			resp.Result, err = json.Marshal(res)
		}
	case CmdDel:
		err = s.Handler.Del(ctx, req)
	case CmdCheck:
		err = s.Handler.Check(ctx, req)
	case CmdStatus:
		// STATUS speaks in codes 50 and 51 only: a handler that gave neither is not available (50).
		if err = s.Handler.Status(ctx); err != nil {
			if te := asCNIError(err); te.Code != ErrPluginNotAvailable && te.Code != ErrPluginNotAvailableConn {
				err = Errorf(ErrPluginNotAvailable, "ofsdn agent not ready: %v", err)
			}
		}
	case CmdGC:
		var conf struct {
			Valid []struct {
				ContainerID string `json:"containerID"`
				IfName      string `json:"ifname"`
			} `json:"cni.dev/valid-attachments"`
		}
		if err = json.Unmarshal(req.Config, &conf); err == nil {
			valid := make([]Attachment, len(conf.Valid))
			for i, v := range conf.Valid {
				valid[i] = Attachment{ContainerID: v.ContainerID, IfName: v.IfName}
			}
			err = s.Handler.GC(ctx, valid)
		} else {
			err = Errorf(ErrDecoding, "ofsdn agent: GC config: %v", err)
		}
	default:
		err = Errorf(ErrInvalidEnv, "ofsdn agent: unknown CNI command %q", req.Command)
	}
	if err != nil {
		resp.Error = asCNIError(err)
	}
	return resp
}
