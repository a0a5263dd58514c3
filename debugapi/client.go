package debugapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// maxResponse bounds an answer (a dump of 50,000 flows is some tens of MB of JSON).
const maxResponse = 512 << 20

// Client calls a node's debug API: on the node through the agent's unix socket, or from anywhere
// through the API server's node proxy. It implements Backend.
type Client struct {
	base   string // URL up to (excluding) Prefix
	http   *http.Client
	tokens TokenSource // nil: no credential (the unix socket's file mode is its authorization)
	// Where names the node for errors.
	Where string
}

// NewSocketClient talks to the agent on this node through its unix socket.
func NewSocketClient(socket string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &Client{base: "http://ofsdn-agent", http: &http.Client{Transport: tr, Timeout: 2 * time.Minute}, Where: socket}
}

// NewNodeProxyClient talks to node's agent on port through the API server's node proxy, over TLS
// (https:<node>:<port>: without the scheme the proxy would speak plain HTTP to the agent). cfg's
// credentials get the request through the API server (get on nodes/proxy, create for a trace); each
// request carries a token of tokens in TokenHeader for the agent, which checks it (README, "The node
// API").
func NewNodeProxyClient(cfg *rest.Config, node string, port int, tokens TokenSource) (*Client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("debug API of node %s: %w", node, err)
	}
	hc.Timeout = 2 * time.Minute
	host := strings.TrimSuffix(cfg.Host, "/")
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	base := host + "/api/v1/nodes/" + url.PathEscape(fmt.Sprintf("https:%s:%d", node, port)) + "/proxy"
	return &Client{base: base, http: hc, tokens: tokens, Where: "node " + node}, nil
}

func (c *Client) do(ctx context.Context, method, path string, body, into any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := c.request(ctx, method, path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("debug API of %s: %w", c.Where, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("debug API of %s: %s: %w", c.Where, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return &ResponseError{URL: c.Where + " " + path, Status: resp.StatusCode, Body: strings.TrimSpace(string(data))}
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("debug API of %s: %s: %w", c.Where, path, err)
	}
	return nil
}

// request is a request of path with the agent's token, when the client has a token source.
func (c *Client) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.tokens != nil {
		token, err := c.tokens.Token(ctx)
		if err != nil {
			return nil, fmt.Errorf("debug API of %s: %w", c.Where, err)
		}
		req.Header.Set(TokenHeader, "Bearer "+token)
	}
	return req, nil
}

func get[T any](ctx context.Context, c *Client, path string) (*T, error) {
	var v T
	if err := c.do(ctx, http.MethodGet, path, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

func (c *Client) Node(ctx context.Context) (*NodeInfo, error) { return get[NodeInfo](ctx, c, PathNode) }
func (c *Client) Desired(ctx context.Context) (*Desired, error) {
	return get[Desired](ctx, c, PathDesired)
}
func (c *Client) Diff(ctx context.Context) (*Diff, error) { return get[Diff](ctx, c, PathDiff) }
func (c *Client) Dump(ctx context.Context) (*Dump, error) { return get[Dump](ctx, c, PathDump) }

func (c *Client) Trace(ctx context.Context, req TraceRequest) (*TraceResponse, error) {
	var v TraceResponse
	if err := c.do(ctx, http.MethodPost, PathTrace, req, &v); err != nil {
		return nil, err
	}
	return &v, nil
}
