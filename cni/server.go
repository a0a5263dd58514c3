package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"k8s.io/klog/v2"
)

// Handler is the agent's side of the CNI verbs.
type Handler interface {
	Add(ctx context.Context, req *Request) (*current.Result, error)
	Del(ctx context.Context, req *Request) error
	Check(ctx context.Context, req *Request) error
	// Status reports whether ADDs can be served now (nil: ready).
	Status(ctx context.Context) error
	// GC releases what belongs to attachments the runtime no longer lists as valid.
	GC(ctx context.Context, valid []Attachment) error
}

// Attachment is a (container ID, interface) pair a runtime still uses.
type Attachment struct{ ContainerID, IfName string }

// Server serves the plugin on a unix socket only root may open.
type Server struct {
	Socket  string
	Handler Handler
	Logger  klog.Logger
	srv     *http.Server
	ln      net.Listener
}

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
	mux := http.NewServeMux()
	mux.HandleFunc("POST /cni", s.serveCNI)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// Serve serves until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(shut)
	}()
	err := s.srv.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) log() klog.Logger {
	if s.Logger.GetSink() == nil {
		return klog.Background().WithName("cni-server")
	}
	return s.Logger
}

func (s *Server) serveCNI(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	resp := &Response{}
	req := &Request{}
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(data, req)
	}
	if err != nil {
		resp.Error = Errorf(ErrDecoding, "ofsdn agent: malformed request: %v", err)
	} else {
		resp = s.dispatch(r.Context(), req)
	}
	log := s.log().WithValues("command", req.Command, "containerID", req.ContainerID, "pod", req.PodNamespace()+"/"+req.PodName(),
		"duration", time.Since(start))
	if resp.Error != nil {
		log.Info("CNI request failed", "code", resp.Error.Code, "err", resp.Error.Msg)
	} else {
		log.V(2).Info("CNI request served")
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
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
		if err = s.Handler.Status(ctx); err != nil {
			err = Errorf(ErrPluginNotAvailable, "ofsdn agent not ready: %v", err)
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
