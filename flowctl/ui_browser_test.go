package flowctl

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/internal/browser"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The console in a real browser (headless Chromium) on the fixture of ui_test.go: every page in the
// light and the dark palette passes the accessibility check and is saved as a screenshot under
// _output/ui-screenshots/ for a person to look at; the trace form is filled in and submitted; a page
// updates itself live; the drops view follows its stream. The lab's own browser test is
// e2e/console_test.go.

// screenshotDir is where browser tests leave their screenshots (never committed).
func screenshotDir(t *testing.T) string {
	root := os.Getenv("OFSDN_REPO")
	if root == "" {
		root = ".."
	}
	dir, err := filepath.Abs(filepath.Join(root, "_output", "ui-screenshots"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestUIInBrowser(t *testing.T) {
	b := browser.StartForTest(t)
	f := newUIFixture(t)
	drops := &recordedDrops{records: testDrops, live: make(chan DropRecord, 4)}
	f.src.drops = drops
	limits := testUILimits
	limits.refresh = time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := newUIServer(f.src, limits, loopbackHosts(ln.Addr()), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s.Handler()}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()

	shots := screenshotDir(t)
	tab := func(t *testing.T) context.Context { return b.TestTab(t, 2*time.Minute) }

	pages := map[string]string{"overview": "/", "networks": "/networks", "network": "/networks/alpha", "tenants": "/tenants",
		"nodes": "/nodes", "node": "/nodes/n1", "policies": "/policies", "drops": "/drops",
		"trace": "/trace?src=blue%2Fa&dst=red%2Fb&port=8080"}
	for _, scheme := range []string{"light", "dark"} {
		for name, path := range pages {
			t.Run(scheme+"/"+name, func(t *testing.T) {
				ctx := tab(t)
				if err := chromedp.Do(ctx, browser.ColorScheme(scheme), chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS("footer"))); err != nil {
					t.Fatal(err)
				}
				r, err := chromedp.Run(ctx, browser.CheckAccessibility())
				if err != nil {
					t.Fatal(err)
				}
				if len(r.Violations) > 0 {
					t.Errorf("accessibility:\n%s", r)
				}
				if r.Checked < 10 || len(r.Incomplete) > 0 {
					t.Errorf("contrast measured on %d texts; not measured: %v", r.Checked, r.Incomplete)
				}
				if err := chromedp.Do(ctx, browser.Screenshot(filepath.Join(shots, "fake-"+scheme+"-"+name+".png"))); err != nil {
					t.Error(err)
				}
			})
		}
	}

	t.Run("trace form", func(t *testing.T) {
		ctx := tab(t)
		if err := chromedp.Do(ctx, chromedp.Navigate(base+"/trace"),
			chromedp.SendKeys(chromedp.ID("src"), "blue/a"), chromedp.SendKeys(chromedp.ID("dst"), "blue/c"),
			chromedp.SendKeys(chromedp.ID("port"), "8080"), chromedp.Click(chromedp.CSS("#trace-form button[type=submit]")),
			chromedp.WaitVisible(chromedp.ID("verdict"))); err != nil {
			t.Fatal(err)
		}
		verdict, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("verdict")))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(verdict, "delivered to blue/c via node n2") {
			t.Errorf("verdict %q", verdict)
		}
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		if !strings.Contains(loc, "src=blue%2Fa") || !strings.Contains(loc, "dst=blue%2Fc") {
			t.Errorf("the trace's address %s does not hold its question", loc)
		}
	})

	t.Run("live update", func(t *testing.T) {
		ctx := tab(t)
		if err := chromedp.Do(ctx, chromedp.Navigate(base+"/tenants"), chromedp.WaitVisible(chromedp.CSS("footer"))); err != nil {
			t.Fatal(err)
		}
		if _, err := f.net.NetworkV1().NetNamespaces().Create(context.Background(), &networkv1.NetNamespace{
			ObjectMeta: metav1.ObjectMeta{Name: "latecomer"}, NetName: "latecomer", NetID: 42}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The page's script fetches it again every second (limits.refresh) and swaps its content.
		if _, ok := waitText(ctx, chromedp.ID("content"), "latecomer"); !ok {
			status, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("live-status")))
			t.Fatalf("the page did not update itself (status %q)", status)
		}
		if pressed, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(".live button"), "aria-pressed")); err != nil || pressed.Value != "false" {
			t.Errorf("the pause button: aria-pressed %q, %v", pressed.Value, err)
		}
	})

	t.Run("drops stream", func(t *testing.T) {
		ctx := tab(t)
		if err := chromedp.Do(ctx, chromedp.Navigate(base+"/drops?since=0s"), chromedp.WaitVisible(chromedp.ID("drops"))); err != nil {
			t.Fatal(err)
		}
		// Wait until the stream is open, then send a drop.
		if st, ok := waitText(ctx, chromedp.ID("drops-status"), "following new drops"); !ok {
			t.Fatalf("the stream did not open: %q", st)
		}
		d := testDrops[0]
		d.Src, d.Time = "red/late", time.Now()
		drops.live <- d
		if txt, ok := waitText(ctx, chromedp.CSS("#drops tbody tr:first-child"), "red/late"); !ok {
			t.Fatalf("the streamed drop did not appear; first row %q", txt)
		}
		if err := chromedp.Do(ctx, browser.Screenshot(filepath.Join(shots, "fake-light-drops-live.png"))); err != nil {
			t.Error(err)
		}
	})
}

// waitText polls the text of sel until it contains want (ok) or a minute has passed; it returns the
// text it read last.
func waitText[S chromedp.Selectable](ctx context.Context, sel S, want string) (string, bool) {
	deadline := time.Now().Add(time.Minute)
	for {
		txt, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err == nil && strings.Contains(txt, want) {
			return txt, true
		}
		if time.Now().After(deadline) {
			return txt, false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
