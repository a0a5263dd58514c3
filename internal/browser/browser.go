// Package browser drives a real browser for tests of ofsdn's web pages (flowctl ui): Debian's
// headless Chromium, through the DevTools protocol (chromedp). It starts a Chromium that can reach
// nothing but loopback, takes full-page screenshots for a person to look at, and checks a page for the
// accessibility basics.
//
// The accessibility check is a small checker of our own (a11y.js), run in the page: form labels, image
// alternatives, link and button names, table headers, one main landmark and h1, the page's language
// and title, unique ids, and the WCAG AA contrast of every piece of text as rendered (4.5:1, 3:1 for
// large text). Why not axe-core: its browser bundle is built by npm and is not on the Go module proxy
// (the module proxy serves its sources only, which need node to build), and the project builds and
// tests without a node toolchain; vendoring 500 kB of minified third-party JavaScript that nobody here
// reviews was the other way. The checker is itself tested against pages with known faults
// (browser_test.go), so a rule that stops catching its fault fails.
package browser

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

// Names Chromium is installed under; $OFSDN_CHROMIUM names another.
var execNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// ExecPath finds Chromium.
func ExecPath() (string, error) {
	if p := os.Getenv("OFSDN_CHROMIUM"); p != "" {
		return exec.LookPath(p)
	}
	for _, n := range execNames {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no Chromium on this machine (make deps installs Debian's chromium package; $OFSDN_CHROMIUM names another binary)")
}

// Require returns Chromium's path for a test, or skips the test saying why — unless
// $OFSDN_REQUIRE_BROWSER is set (the Makefile sets it after make deps installed Chromium): then a
// missing browser fails the test instead of hiding it.
func Require(t testing.TB) string {
	t.Helper()
	p, err := ExecPath()
	if err == nil {
		return p
	}
	if os.Getenv("OFSDN_REQUIRE_BROWSER") != "" {
		t.Fatalf("browser test: %v", err)
	}
	t.Skipf("browser test skipped: %v", err)
	return ""
}

// Browser is a running headless Chromium.
type Browser struct {
	ctx    context.Context // the browser's first tab; others derive from it
	cancel context.CancelFunc
}

// loopbackOnly are the flags that keep Chromium off every network but loopback (the lab's network
// rule): every request for a host that is not loopback goes to a proxy at 127.0.0.1:9, where nothing
// listens, and no host name resolves; background services (component updates, safe browsing, metrics,
// domain reliability) are off besides.
var loopbackOnly = []chromedp.ExecAllocatorOption{
	chromedp.ProxyServer("http://127.0.0.1:9"),
	chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1"),
	chromedp.Flag("disable-component-update", true),
	chromedp.Flag("disable-domain-reliability", true),
	chromedp.Flag("no-pings", true),
	chromedp.Flag("disable-features", "Translate,BlinkGenPropertyTrees,OptimizationHints,MediaRouter,AutofillServerCommunication"),
}

// Start starts Chromium; it stops when ctx ends or Close is called. logf, when set, receives the
// browser's errors.
func Start(ctx context.Context, execPath string, logf func(string, ...any)) (*Browser, error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(execPath),
		chromedp.NoSandbox, // tests run as root, where Chromium's sandbox refuses to start
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
	)
	opts = append(opts, loopbackOnly...)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	var copts []chromedp.ContextOption
	if logf != nil {
		copts = append(copts, chromedp.WithErrorf(logf))
	}
	bctx, bcancel := chromedp.NewContext(actx, copts...)
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		bcancel()
		acancel()
		return nil, fmt.Errorf("start %s: %w", execPath, err)
	}
	return &Browser{ctx: bctx, cancel: func() { bcancel(); acancel() }}, nil
}

// Close stops the browser.
func (b *Browser) Close() { b.cancel() }

// Tab opens a new tab; cancel closes it.
func (b *Browser) Tab() (context.Context, context.CancelFunc) {
	return chromedp.NewContext(b.ctx)
}

// StartForTest starts Chromium for a test (Require: skipped, or failed, without one); it stops when
// the test ends. With -short the test is skipped.
func StartForTest(t testing.TB) *Browser {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Chromium")
	}
	b, err := Start(t.Context(), Require(t), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// TestTab opens a tab for a test, bounded by timeout; it closes when the test ends.
func (b *Browser) TestTab(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := b.Tab()
	t.Cleanup(cancel)
	ctx, cancel2 := context.WithTimeout(ctx, timeout)
	t.Cleanup(cancel2)
	return ctx
}

// Screenshot saves a full-page PNG screenshot to path, making its directory.
func Screenshot(path string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		png, err := chromedp.FullScreenshot(100)(ctx, t)
		if err != nil {
			return fmt.Errorf("screenshot %s: %w", path, err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, png, 0o644)
	})
}

// ColorScheme emulates the user's light or dark preference (prefers-color-scheme).
func ColorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	})
}

//go:embed a11y.js
var a11yJS string

// Violation is one failed accessibility rule.
type Violation struct {
	Rule    string `json:"rule"`
	Element string `json:"element"`
	Detail  string `json:"detail"`
}

func (v Violation) String() string {
	if v.Element == "" {
		return v.Rule + ": " + v.Detail
	}
	return v.Rule + ": " + v.Element + ": " + v.Detail
}

// Report is what the accessibility check found on a page.
type Report struct {
	Violations []Violation `json:"violations"`
	// Checked is how many text elements had their contrast measured; Incomplete names those whose
	// colours could not be told (a background image, a colour function the checker does not parse).
	Checked    int      `json:"checked"`
	Incomplete []string `json:"incomplete"`
}

// Rules lists the rules that failed, once each.
func (r Report) Rules() []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range r.Violations {
		if !seen[v.Rule] {
			seen[v.Rule] = true
			out = append(out, v.Rule)
		}
	}
	return out
}

func (r Report) String() string {
	var b strings.Builder
	for _, v := range r.Violations {
		b.WriteString(v.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// CheckAccessibility runs the checker on the page the tab shows.
func CheckAccessibility() chromedp.Action[Report] {
	return func(ctx context.Context, t *chromedp.Target) (Report, error) {
		var r Report
		raw, err := chromedp.Evaluate[[]byte](a11yJS)(ctx, t)
		if err != nil {
			return r, fmt.Errorf("accessibility check: %w", err)
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return r, fmt.Errorf("accessibility check: %w", err)
		}
		return r, nil
	}
}
