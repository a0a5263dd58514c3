package kubelab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ofsdn/ofsdn/internal/proc"
)

func clientFor(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return cs
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// One cluster serves the tests that need only etcd and the apiserver; each starts in ~3 s, but the
// shared machine is slow enough that it adds up.
func TestAPIServer(t *testing.T) {
	c := Start(t, Options{})
	admin := clientFor(t, c.AdminConfig())

	t.Run("admin creates a namespace and a ConfigMap", func(t *testing.T) {
		ctx := testContext(t)
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab"}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace: %v", err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "cfg"}, Data: map[string]string{"k": "v"}}
		if _, err := admin.CoreV1().ConfigMaps("lab").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ConfigMap: %v", err)
		}
		got, err := admin.CoreV1().ConfigMaps("lab").Get(ctx, "cfg", metav1.GetOptions{})
		if err != nil || got.Data["k"] != "v" {
			t.Fatalf("get ConfigMap: %+v, %v", got, err)
		}
		out, err := c.Kubectl("get", "configmap", "cfg", "-n", "lab", "-o", "jsonpath={.data.k}")
		if err != nil || out != "v" {
			t.Fatalf("kubectl get configmap: %q, %v", out, err)
		}
	})

	t.Run("kubectl and the server agree on the version", func(t *testing.T) {
		out, err := c.Kubectl("version")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"Client Version: v1.34.4", "Server Version: v1.34.4"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl version: want %q in\n%s", want, out)
			}
		}
	})

	t.Run("a ServiceAccount gets exactly the RBAC bound to it", func(t *testing.T) {
		ctx := testContext(t)
		const ns, sa = "rbac", "reader"
		cfg := c.ServiceAccountConfig(t, ns, sa)
		client := clientFor(t, cfg)

		review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("whoami: %v", err)
		}
		if want := "system:serviceaccount:" + ns + ":" + sa; review.Status.UserInfo.Username != want {
			t.Fatalf("authenticated as %q, want %q", review.Status.UserInfo.Username, want)
		}
		if _, err := client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("list secrets before any RoleBinding: want Forbidden, got %v", err)
		}

		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secret-reader"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list"}}}}
		if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Role: %v", err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secret-reader"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "secret-reader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}}}
		if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create RoleBinding: %v", err)
		}
		// The RBAC authorizer reads bindings from an informer cache: allowed shortly, not at once.
		var lastErr error
		if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			_, lastErr = client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
			return lastErr == nil, nil
		}); err != nil {
			t.Fatalf("list secrets after the RoleBinding: %v (last: %v)", err, lastErr)
		}
		if _, err := client.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("list secrets in another namespace: want Forbidden, got %v", err)
		}
	})

	t.Run("static users", func(t *testing.T) {
		tests := []struct {
			name      string
			user      string
			groups    []string
			forbidden bool
		}{
			{name: "a user without bindings is forbidden", user: "alice", forbidden: true},
			{name: "a member of system:masters is allowed", user: "bob", groups: []string{"system:masters"}},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				ctx := testContext(t)
				client := clientFor(t, c.UserConfig(t, tc.user, tc.groups...))
				review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("whoami: %v", err)
				}
				if review.Status.UserInfo.Username != tc.user {
					t.Errorf("authenticated as %q, want %q", review.Status.UserInfo.Username, tc.user)
				}
				_, err = client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
				if tc.forbidden != apierrors.IsForbidden(err) || (!tc.forbidden && err != nil) {
					t.Errorf("list namespaces: forbidden=%v wanted, got err %v", tc.forbidden, err)
				}
			})
		}
	})
}

// TestPause: a paused API server accepts connections but answers nothing until it is resumed, the way
// an overloaded or stalled one does; outage tests stand on it.
func TestPause(t *testing.T) {
	c := Start(t, Options{})
	admin := clientFor(t, c.AdminConfig())
	get := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := admin.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err
	}
	if err := get(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	resume, err := c.Pause(APIServer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(resume)
	if err := get(time.Second); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("request to a paused API server: %v, want it to time out", err)
	}
	resume()
	if err := get(10 * time.Second); err != nil {
		t.Fatalf("after resume: %v", err)
	}
	if _, err := c.Pause(Scheduler); err == nil {
		t.Error("pausing a component that does not run succeeded")
	}
	// Left paused: Stop (t.Cleanup) resumes it to stop it.
	if _, err := c.Pause(APIServer); err != nil {
		t.Fatal(err)
	}
}

func TestControllerManagerAndScheduler(t *testing.T) {
	c := Start(t, Options{ControllerManager: true, Scheduler: true})
	ctx := testContext(t)
	admin := clientFor(t, c.AdminConfig())
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fresh"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	// Both come from controllers, not the apiserver: the ServiceAccount controller and the root CA
	// publisher (which must publish the cluster's CA, or pods could not verify the apiserver).
	var lastErr error
	if err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if _, lastErr = admin.CoreV1().ServiceAccounts("fresh").Get(ctx, "default", metav1.GetOptions{}); lastErr != nil {
			return false, nil
		}
		cm, err := admin.CoreV1().ConfigMaps("fresh").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		if lastErr = err; err != nil {
			return false, nil
		}
		if cm.Data["ca.crt"] != string(c.CACert()) {
			lastErr = fmt.Errorf("kube-root-ca.crt holds another CA")
			return false, nil
		}
		return true, nil
	}); err != nil {
		t.Fatalf("default ServiceAccount and kube-root-ca.crt in a new namespace: %v (last: %v)", err, lastErr)
	}
	pids := c.PIDs()
	for _, name := range []string{Etcd, APIServer, ControllerManager, Scheduler} {
		if pids[name] == 0 {
			t.Errorf("PIDs: no %s in %v", name, pids)
		}
	}
}

// Stop (also what t.Cleanup runs) leaves no process and no directory behind, and clusters started in
// parallel do not collide.
func TestParallelClustersStopClean(t *testing.T) {
	if testing.Short() {
		t.Skip("kubelab: runs real kube-apiservers; skipped with -short")
	}
	type started struct {
		c    *Cluster
		pids map[string]int
	}
	results := make(chan started, 2)
	t.Run("group", func(t *testing.T) {
		for i := range 2 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				c := Start(t, Options{ControllerManager: i == 0})
				ctx := testContext(t)
				if _, err := clientFor(t, c.AdminConfig()).CoreV1().Namespaces().Create(ctx,
					&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "same-name"}}, metav1.CreateOptions{}); err != nil {
					t.Fatalf("create namespace: %v", err)
				}
				results <- started{c, c.PIDs()}
			})
		}
	})
	close(results)
	servers := map[string]bool{}
	for r := range results {
		if servers[r.c.Server()] {
			t.Errorf("two clusters share %s", r.c.Server())
		}
		servers[r.c.Server()] = true
		// The subtests have finished, so their t.Cleanup ran Stop already; Stop is idempotent.
		r.c.Stop()
		for name, pid := range r.pids {
			if proc.Alive(pid) {
				t.Errorf("%s (pid %d) still runs after Stop", name, pid)
			}
		}
		if _, err := os.Stat(r.c.Dir()); !os.IsNotExist(err) && os.Getenv("OFSDN_KEEP_TEST_DIRS") == "" {
			t.Errorf("dir %s still there after Stop: %v", r.c.Dir(), err)
		}
	}
	if len(servers) != 2 {
		t.Fatalf("want 2 clusters, got %d", len(servers))
	}
}

// Sweep kills a dead test process's daemons and removes its dir, and leaves a live owner's alone.
func TestSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := dead.Process.Pid
	if proc.Alive(deadPID) {
		t.Skip("the PID of an exited process was reused at once")
	}
	mk := func(owner int) (string, *exec.Cmd) {
		dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-sweeptest-", Prefix, owner))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		// sh's $0 is in the dir, so the command line names it as a real daemon's flags do; "; :" keeps
		// sh from exec'ing sleep, and the group (Setpgid, as Start does) holds the sleep child.
		cmd := exec.Command("sh", "-c", "sleep 600; :", filepath.Join(dir, "daemon"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
		if err := os.WriteFile(filepath.Join(dir, "fake.pid"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir, cmd
	}
	staleDir, stale := mk(deadPID)
	liveDir, live := mk(os.Getpid())

	Sweep()

	if err := stale.Wait(); err == nil {
		t.Errorf("stale daemon exited cleanly: want killed")
	}
	if _, err := os.Stat(staleDir); !os.IsNotExist(err) {
		t.Errorf("stale dir %s still there: %v", staleDir, err)
	}
	if !proc.Alive(live.Process.Pid) {
		t.Errorf("Sweep killed a live owner's daemon")
	}
	if _, err := os.Stat(liveDir); err != nil {
		t.Errorf("Sweep removed a live owner's dir: %v", err)
	}
}

// BenchmarkStart reports how long etcd + kube-apiserver take to answer /readyz (and with the controller
// manager and scheduler healthy too), and how long Stop takes.
func BenchmarkStart(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts Options
	}{
		{"apiserver", Options{}},
		{"all", Options{ControllerManager: true, Scheduler: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var start, stop time.Duration
			for range b.N {
				began := time.Now()
				c := Start(b, bc.opts)
				start += time.Since(began)
				b.StopTimer()
				began = time.Now()
				c.Stop()
				stop += time.Since(began)
				b.StartTimer()
			}
			b.ReportMetric(start.Seconds()/float64(b.N), "s/start")
			b.ReportMetric(stop.Seconds()/float64(b.N), "s/stop")
		})
	}
}

func TestBinDir(t *testing.T) {
	empty := t.TempDir()
	tests := []struct {
		name    string
		env     string
		wantErr string
	}{
		{name: "an empty OFSDN_K8S_BIN names the missing binary and the fix", env: empty,
			wantErr: filepath.Join(empty, "etcd") + " is missing: run `make k8s-bins` (hack/build-k8s.sh)"},
		{name: "a missing directory too", env: filepath.Join(empty, "nope"), wantErr: "run `make k8s-bins`"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OFSDN_K8S_BIN", tc.env)
			dir, err := BinDir()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("BinDir() = %q, %v; want error containing %q", dir, err, tc.wantErr)
			}
		})
	}
}
