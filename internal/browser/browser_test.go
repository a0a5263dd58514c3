package browser

import (
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The checker against pages with known faults: a good page passes with its text measured, and each
// fault of the bad page is caught by its rule. A rule that stops catching its fault fails here.

const goodPage = `<!doctype html><html lang="en"><head><title>good</title>
<style>body{background:#fff;color:#1b1f24} .muted{color:#57606a} .on-dark{background:#1b1f24;color:#fff}
input{color:#1b1f24;background:#fff} input::placeholder{color:#57606a}</style></head>
<body><header class="on-dark">ofsdn</header><main><h1>Good</h1>
<p class="muted">quiet but readable</p>
<form><label for="q">Query</label><input id="q" name="q" placeholder="ns/pod">
<label>Proto <select name="p"><option>tcp</option></select></label>
<input type="text" aria-label="port" value="80"><button type="submit">Go</button></form>
<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=" alt="">
<svg aria-hidden="true" width="4" height="4"></svg>
<table><tr><th>a</th></tr><tr><td>1</td></tr></table><a href="#x">more</a>
<div style="display:none"><input id="hidden-no-label"></div>
</main></body></html>`

const badPage = `<!doctype html><html><head><title> </title>
<style>body{background:#fff;color:#1b1f24} .faint{color:#aaaaaa} .big{font-size:30px;color:#959595}</style></head>
<body><div><p class="faint">too faint</p><p class="big">large but still too faint</p>
<input id="dup" name="q"><input id="dup" type="checkbox">
<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">
<svg width="4" height="4"></svg><button></button><a href="#x"></a>
<table><tr><td>no header</td></tr></table></div></body></html>`

func serve(t *testing.T, page string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(page))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}

func check(t *testing.T, b *Browser, url string) Report {
	t.Helper()
	ctx := b.TestTab(t, time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	r, err := chromedp.Run(ctx, CheckAccessibility())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAccessibilityChecker(t *testing.T) {
	b := StartForTest(t)

	good := check(t, b, serve(t, goodPage))
	if len(good.Violations) > 0 || good.Checked < 8 {
		t.Errorf("the good page: %d texts measured, violations:\n%s", good.Checked, good)
	}

	bad := check(t, b, serve(t, badPage))
	want := []string{"html-lang", "document-title", "landmark-main", "page-has-heading-one", "duplicate-id", "image-alt",
		"svg-img-alt", "label", "button-name", "link-name", "table-headers", "color-contrast"}
	for _, rule := range want {
		if !slices.Contains(bad.Rules(), rule) {
			t.Errorf("the bad page's %s fault was not caught; found:\n%s", rule, bad)
		}
	}
	contrast := 0
	for _, v := range bad.Violations {
		if v.Rule == "color-contrast" {
			contrast++
			if !strings.Contains(v.Detail, "need") {
				t.Errorf("contrast violation does not say what is needed: %s", v)
			}
		}
	}
	if contrast != 2 { // #aaa at 16px (2.3:1 < 4.5) and #959595 at 30px (2.995:1, just under 3)
		t.Errorf("want 2 contrast violations, got %d:\n%s", contrast, bad)
	}
}

// The browser reaches nothing but loopback: a page of another host goes to the dead proxy at
// 127.0.0.1:9 (so no packet leaves the machine, and no name is looked up), while loopback pages load.
func TestLoopbackOnly(t *testing.T) {
	b := StartForTest(t)
	ctx := b.TestTab(t, time.Minute)
	// .invalid never resolves anywhere (RFC 2606); and were the proxy not in force, the name would
	// still not be looked up: host-resolver-rules maps every name but localhost to NOTFOUND.
	err := chromedp.Do(ctx, chromedp.Navigate("http://ofsdn-browser-test.invalid/"))
	if err == nil || !strings.Contains(err.Error(), "ERR_PROXY_CONNECTION_FAILED") {
		t.Errorf("a page of another host: %v, want the dead proxy's ERR_PROXY_CONNECTION_FAILED", err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(serve(t, goodPage))); err != nil {
		t.Errorf("a loopback page: %v", err)
	}
}
