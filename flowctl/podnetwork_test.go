package flowctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	networkfake "github.com/ofsdn/ofsdn/client/clientset/versioned/fake"
	"github.com/ofsdn/ofsdn/controller/controllertest"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/ofsdn/ofsdn/internal/proc"
)

func TestParsePodNetworkArgs(t *testing.T) {
	join, iso, glob := networkv1.ChangeNetworkJoin, networkv1.ChangeNetworkIsolate, networkv1.ChangeNetworkGlobal
	for _, tc := range []struct {
		name    string
		args    []string
		want    PodNetworkRequest
		wantErr string // substring; "" = success
	}{
		{"join", []string{"join-projects", "--to=a", "b", "c"},
			PodNetworkRequest{Action: join, To: "a", Projects: []string{"b", "c"}, Timeout: 30 * time.Second}, ""},
		{"join, flags after the projects", []string{"join-projects", "b", "--to", "a", "c", "--timeout=5s", "--kubeconfig=/k"},
			PodNetworkRequest{Action: join, To: "a", Projects: []string{"b", "c"}, Timeout: 5 * time.Second, Kubeconfig: "/k"}, ""},
		{"join drops the target and duplicates", []string{"join-projects", "--to=a", "a", "b", "b"},
			PodNetworkRequest{Action: join, To: "a", Projects: []string{"b"}, Timeout: 30 * time.Second}, ""},
		{"join to itself only is a no-op", []string{"join-projects", "--to=a", "a"},
			PodNetworkRequest{Action: join, To: "a", Timeout: 30 * time.Second}, ""},
		{"isolate", []string{"isolate-projects", "a", "b"},
			PodNetworkRequest{Action: iso, Projects: []string{"a", "b"}, Timeout: 30 * time.Second}, ""},
		{"global", []string{"make-projects-global", "--timeout=1m", "a"},
			PodNetworkRequest{Action: glob, Projects: []string{"a"}, Timeout: time.Minute}, ""},
		{"after -- everything is a project", []string{"isolate-projects", "--", "a", "b"},
			PodNetworkRequest{Action: iso, Projects: []string{"a", "b"}, Timeout: 30 * time.Second}, ""},
		{"no command", nil, PodNetworkRequest{}, "no command given"},
		{"unknown command", []string{"merge-projects", "a"}, PodNetworkRequest{}, `unknown command "merge-projects"`},
		{"join without --to", []string{"join-projects", "a", "b"}, PodNetworkRequest{}, "--to=PROJECT is required"},
		{"join with an empty --to", []string{"join-projects", "--to=", "b"}, PodNetworkRequest{}, "--to=PROJECT is required"},
		{"no projects", []string{"isolate-projects"}, PodNetworkRequest{}, "no projects given"},
		{"join with no projects", []string{"join-projects", "--to=a"}, PodNetworkRequest{}, "no projects given"},
		{"malformed project", []string{"make-projects-global", "Bad_Name"}, PodNetworkRequest{}, `project "Bad_Name" is not a valid namespace name`},
		{"malformed --to", []string{"join-projects", "--to=x/y", "b"}, PodNetworkRequest{}, `--to: project "x/y"`},
		{"--to on isolate", []string{"isolate-projects", "--to=a", "b"}, PodNetworkRequest{}, "--to is for join-projects only"},
		{"bad timeout", []string{"isolate-projects", "--timeout=soon", "a"}, PodNetworkRequest{}, "invalid value"},
		{"zero timeout", []string{"isolate-projects", "--timeout=0s", "a"}, PodNetworkRequest{}, "--timeout must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePodNetworkArgs(tc.args, io.Discard, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// fakeController plays the controller against fake clientsets: it answers each change-network request
// by carrying it out, by refusing it with a Warning Event, or not at all.
type fakeController struct {
	kube *kubefake.Clientset
	net  *networkfake.Clientset
	mode string // "obey", "refuse" or "ignore"
	next uint32
}

func newFakeCluster(t *testing.T, mode string, netids map[string]uint32) PodNetworkClients {
	t.Helper()
	fc := &fakeController{kube: kubefake.NewClientset(), net: networkfake.NewSimpleClientset(), mode: mode, next: 1000}
	ctx, cancel := context.WithCancel(context.Background())
	for name, id := range netids {
		nn := &networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: name}, NetName: name, NetID: id}
		if _, err := fc.net.NetworkV1().NetNamespaces().Create(ctx, nn, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// An old warning about one of them must not fail the command.
	old := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "old", Namespace: "default", UID: "old"}, Type: corev1.EventTypeWarning,
		Reason: "InvalidChangeNetwork", Message: "an old refusal", InvolvedObject: corev1.ObjectReference{Kind: "NetNamespace", Name: "b"}}
	if _, err := fc.kube.CoreV1().Events("default").Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if err := fc.step(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("fake controller: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return PodNetworkClients{Kube: fc.kube, Net: fc.net}
}

func (fc *fakeController) step(ctx context.Context) error {
	if fc.mode == "ignore" {
		return nil
	}
	list, err := fc.net.NetworkV1().NetNamespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, nn := range list.Items {
		value, ok := nn.Annotations[networkv1.ChangeNetworkAnnotation]
		if !ok {
			continue
		}
		upd := nn.DeepCopy()
		delete(upd.Annotations, networkv1.ChangeNetworkAnnotation)
		if fc.mode == "refuse" {
			ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: nn.Name + ".refused", Namespace: "default", UID: "new"},
				Type: corev1.EventTypeWarning, Reason: "InvalidChangeNetwork", Message: "no VNIDs left; nothing changed",
				InvolvedObject: corev1.ObjectReference{Kind: "NetNamespace", Name: nn.Name}}
			if _, err := fc.kube.CoreV1().Events("default").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
				return err
			}
		} else {
			req, err := networkv1.ParseChangeNetwork(value)
			if err != nil {
				return err
			}
			switch req.Action {
			case networkv1.ChangeNetworkGlobal:
				upd.NetID = 0
			case networkv1.ChangeNetworkIsolate:
				fc.next++
				upd.NetID = fc.next
			case networkv1.ChangeNetworkJoin:
				to, err := fc.net.NetworkV1().NetNamespaces().Get(ctx, req.Target, metav1.GetOptions{})
				if err != nil {
					return err
				}
				upd.NetID = to.NetID
			}
		}
		if _, err := fc.net.NetworkV1().NetNamespaces().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func TestChangePodNetworkFake(t *testing.T) {
	netids := map[string]uint32{"a": 11, "b": 12, "c": 13}
	for _, tc := range []struct {
		name    string
		mode    string
		args    []string
		want    []ProjectNetID
		wantErr string
	}{
		{"join", "obey", []string{"join-projects", "--to=a", "b", "c"}, []ProjectNetID{{"a", 11}, {"b", 11}, {"c", 11}}, ""},
		{"isolate", "obey", []string{"isolate-projects", "a", "b"}, []ProjectNetID{{"a", 1001}, {"b", 1002}}, ""},
		{"global", "obey", []string{"make-projects-global", "c"}, []ProjectNetID{{"c", 0}}, ""},
		{"join to itself", "ignore", []string{"join-projects", "--to=a", "a"}, []ProjectNetID{{"a", 11}}, ""},
		{"unknown project", "obey", []string{"isolate-projects", "a", "nope"}, nil, `project "nope": no NetNamespace nope`},
		{"unknown --to", "obey", []string{"join-projects", "--to=nope", "a"}, nil, `project "nope": no NetNamespace`},
		{"refused", "refuse", []string{"isolate-projects", "b"}, nil, `project "b": the controller refused isolate: InvalidChangeNetwork: no VNIDs left`},
		{"timeout", "ignore", []string{"make-projects-global", "--timeout=300ms", "c"}, nil, `project "c": the controller did not carry out global within 300ms`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCluster(t, tc.mode, netids)
			req, err := ParsePodNetworkArgs(tc.args, io.Discard, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ChangePodNetwork(context.Background(), c, req, 10*time.Millisecond)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if tc.name == "timeout" && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("timeout error %v does not wrap context.DeadlineExceeded", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWriteNetIDs(t *testing.T) {
	var b bytes.Buffer
	if err := writeNetIDs(&b, []ProjectNetID{{"a", 11}, {"long-project", 0}}); err != nil {
		t.Fatal(err)
	}
	want := "NAME          NETID\na             11\nlong-project  0\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// parseTable reads the NAME NETID table a pod-network command prints.
func parseTable(t *testing.T, out string) map[string]uint32 {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || strings.Join(strings.Fields(lines[0]), " ") != "NAME NETID" {
		t.Fatalf("no NAME NETID header in %q", out)
	}
	m := map[string]uint32{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 2 {
			t.Fatalf("bad row %q in %q", l, out)
		}
		id, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			t.Fatalf("bad NETID in %q: %v", l, err)
		}
		m[f[0]] = uint32(id)
	}
	return m
}

// TestPodNetworkLab runs the commands through Main against a real API server with the controller running
// in-process as deployed (controllertest: its ServiceAccount, leader election).
func TestPodNetworkLab(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real kube-apiserver; skipped with -short")
	}
	api := kubelab.StartDeploy(t, kubelab.Options{}, controllertest.Manifests...)
	admin := kubernetes.NewForConfigOrDie(api.AdminConfig())
	netc := networkclient.NewForConfigOrDie(api.AdminConfig())
	stopController := controllertest.Start(t, api, controllertest.Spec("10.128.0.0/14", 9), "test")
	ctx := context.Background()

	projects := []string{"pa", "pb", "pc"}
	for _, p := range projects {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	netids := func() map[string]uint32 {
		t.Helper()
		list, err := netc.NetworkV1().NetNamespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]uint32{}
		for _, nn := range list.Items {
			if _, pending := nn.Annotations[networkv1.ChangeNetworkAnnotation]; pending {
				t.Errorf("%s still has %s", nn.Name, networkv1.ChangeNetworkAnnotation)
			}
			m[nn.Name] = nn.NetID
		}
		return m
	}
	proc.Eventually(t, time.Minute, fmt.Sprintf("NETIDs for %v", projects), func() bool {
		ids := netids()
		return len(ids) >= 3 && ids["pa"] != 0 && ids["pb"] != 0 && ids["pc"] != 0
	})
	initial := netids()
	kc := "--kubeconfig=" + api.KubeconfigPath()
	run := func(args ...string) (map[string]uint32, error) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		err := Main(ctx, append([]string{"pod-network"}, append(args, kc)...), &stdout, &stderr)
		if err != nil {
			return nil, err
		}
		return parseTable(t, stdout.String()), nil
	}
	must := func(args ...string) map[string]uint32 {
		t.Helper()
		got, err := run(args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		// The printed table is what the API holds.
		api := netids()
		for name, id := range got {
			if api[name] != id {
				t.Errorf("%v printed %s NETID %d; the NetNamespace has %d", args, name, id, api[name])
			}
		}
		return got
	}

	for round := range 2 {
		t.Logf("round %d", round)
		got := must("join-projects", "--to=pa", "pb", "pc")
		want := map[string]uint32{"pa": initial["pa"], "pb": initial["pa"], "pc": initial["pa"]}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("join: printed %v, want %v", got, want)
		}
		got = must("isolate-projects", "pb", "pc")
		if len(got) != 2 || got["pb"] == got["pc"] || got["pb"] == initial["pa"] || got["pc"] == initial["pa"] || got["pb"] == 0 || got["pc"] == 0 {
			t.Errorf("isolate: printed %v (pa has %d)", got, initial["pa"])
		}
		seen := map[uint32]string{}
		for name, id := range netids() {
			if other, dup := seen[id]; dup && id != 0 {
				t.Errorf("after isolate %s and %s share NETID %d", name, other, id)
			}
			seen[id] = name
		}
		got = must("make-projects-global", "pb", "pc")
		if want := map[string]uint32{"pb": 0, "pc": 0}; !reflect.DeepEqual(got, want) {
			t.Errorf("global: printed %v, want %v", got, want)
		}
	} // the second round's join starts from global projects
	if got := must("join-projects", "--to=pa", "pa"); !reflect.DeepEqual(got, map[string]uint32{"pa": initial["pa"]}) {
		t.Errorf("join to itself: printed %v", got)
	}

	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"unknown project", []string{"isolate-projects", "pa", "no-such-project"}, `project "no-such-project": no NetNamespace`},
		{"unknown --to", []string{"join-projects", "--to=no-such-project", "pa"}, `project "no-such-project": no NetNamespace`},
		{"malformed project", []string{"make-projects-global", "Not_A_Namespace"}, `project "Not_A_Namespace" is not a valid namespace name`},
		{"missing --to", []string{"join-projects", "pa"}, "--to=PROJECT is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := netids()
			_, err := run(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
			if after := netids(); !reflect.DeepEqual(before, after) {
				t.Errorf("a failed command changed NETIDs: %v → %v", before, after)
			}
		})
	}

	// With the controller stopped, nothing clears the request: the command times out naming the project.
	stopController()
	_, err := run("isolate-projects", "--timeout=1s", "pb")
	if want := fmt.Sprintf("project %q: the controller did not carry out isolate within 1s", "pb"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want one containing %q", err, want)
	}
}
