package flowctl

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const podNetworkUsage = `usage: flowctl pod-network <command> [flags] PROJECT...

Ask the ofsdn controller to change projects' VNIDs (as oc adm pod-network does): each command writes the
` + networkv1.ChangeNetworkAnnotation + ` annotation on the projects' NetNamespaces, waits until the
controller carried the request out, and prints the projects' NETIDs.

commands:
  join-projects --to=TARGET PROJECT...  the projects take TARGET's NETID (TARGET itself is left as it is)
  isolate-projects PROJECT...           each project gets a fresh NETID of its own
  make-projects-global PROJECT...       the projects get NETID 0: they reach, and are reached by, every project
`

// podNetworkPoll is how often a pod-network command looks at the NetNamespaces and Events it waits on.
const podNetworkPoll = 100 * time.Millisecond

// PodNetworkRequest is a parsed `flowctl pod-network` command line.
type PodNetworkRequest struct {
	Action     networkv1.ChangeNetworkAction
	To         string   // join only: the project whose NETID the others take
	Projects   []string // in command-line order, without duplicates and (join) without To
	Kubeconfig string
	Timeout    time.Duration
}

// Listed is the projects a command reports on: To first for join, then Projects.
func (r PodNetworkRequest) Listed() []string {
	if r.Action == networkv1.ChangeNetworkJoin {
		return append([]string{r.To}, r.Projects...)
	}
	return slices.Clone(r.Projects)
}

// ParsePodNetworkArgs parses the arguments after "pod-network". Flags may come before, between or after
// the projects, as with oc; "--" ends the flags. --help prints the usage on stdout and returns
// flag.ErrHelp; a command line that does not parse prints the usage on stderr and returns a *UsageError.
func ParsePodNetworkArgs(args []string, stdout, stderr io.Writer) (PodNetworkRequest, error) {
	var req PodNetworkRequest
	name := "pod-network"
	if len(args) > 0 {
		switch args[0] {
		case "join-projects":
			req.Action = networkv1.ChangeNetworkJoin
		case "isolate-projects":
			req.Action = networkv1.ChangeNetworkIsolate
		case "make-projects-global":
			req.Action = networkv1.ChangeNetworkGlobal
		case "help":
			args = append([]string{"--help"}, args[1:]...)
		}
		if req.Action != "" {
			name, args = name+" "+args[0], args[1:]
		}
	}
	c := newCmdLine(name, podNetworkUsage, stdout, stderr)
	c.fs.StringVar(&req.Kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG, else in-cluster)")
	c.fs.DurationVar(&req.Timeout, "timeout", 30*time.Second, "how long to wait for the controller")
	c.fs.StringVar(&req.To, "to", "", "join-projects: the project whose NETID the others take")
	projects, err := c.parse(args)
	if err != nil {
		return PodNetworkRequest{}, err
	}
	if req.Action == "" {
		if len(projects) == 0 {
			return PodNetworkRequest{}, c.usageErrorf("no command given")
		}
		return PodNetworkRequest{}, c.usageErrorf("unknown command %q", projects[0])
	}
	if req.Timeout <= 0 {
		return PodNetworkRequest{}, c.usageErrorf("--timeout must be positive, got %s", req.Timeout)
	}
	switch {
	case req.Action != networkv1.ChangeNetworkJoin && req.To != "":
		return PodNetworkRequest{}, c.usageErrorf("--to is for join-projects only")
	case req.Action == networkv1.ChangeNetworkJoin && req.To == "":
		return PodNetworkRequest{}, c.usageErrorf("--to=PROJECT is required")
	case req.Action == networkv1.ChangeNetworkJoin:
		if err := checkProjectName(req.To); err != nil {
			return PodNetworkRequest{}, c.usageErrorf("--to: %w", err)
		}
	}
	if len(projects) == 0 {
		return PodNetworkRequest{}, c.usageErrorf("no projects given")
	}
	for _, p := range projects {
		if err := checkProjectName(p); err != nil {
			return PodNetworkRequest{}, c.usageErrorf("%w", err)
		}
		// Joining the target to itself is a no-op (oc skips it too); the controller would refuse it.
		if p == req.To || slices.Contains(req.Projects, p) {
			continue
		}
		req.Projects = append(req.Projects, p)
	}
	return req, nil
}

func checkProjectName(p string) error {
	if errs := validation.IsDNS1123Label(p); len(errs) > 0 {
		return fmt.Errorf("project %q is not a valid namespace name: %s", p, strings.Join(errs, "; "))
	}
	return nil
}

// PodNetworkClients are the API clients a pod-network command uses.
type PodNetworkClients struct {
	Kube kubernetes.Interface    // Events
	Net  networkclient.Interface // NetNamespaces
}

// ProjectNetID is one row of a pod-network command's output.
type ProjectNetID struct {
	Name  string
	NetID uint32
}

// RunPodNetwork runs `flowctl pod-network ...` (args without "pod-network") against the cluster its
// kubeconfig names.
func RunPodNetwork(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	req, err := ParsePodNetworkArgs(args, stdout, stderr)
	if err != nil {
		return err
	}
	cfg, err := restConfig(req.Kubeconfig)
	if err != nil {
		return fmt.Errorf("pod-network: %w", err)
	}
	kube, netc, err := clientsOf(cfg)
	if err != nil {
		return fmt.Errorf("pod-network: %w", err)
	}
	rows, err := ChangePodNetwork(ctx, PodNetworkClients{Kube: kube, Net: netc}, req, podNetworkPoll)
	if err != nil {
		return err
	}
	return writeNetIDs(stdout, rows)
}

// clientsOf are the Kubernetes and ofsdn network clients of cfg (restConfig finds it).
func clientsOf(cfg *rest.Config) (*kubernetes.Clientset, *networkclient.Clientset, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	netc, err := networkclient.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("network client: %w", err)
	}
	return kube, netc, nil
}

// restConfig loads --kubeconfig, else $KUBECONFIG (a list of files, as kubectl reads it), else the
// in-cluster configuration.
func restConfig(kubeconfig string) (*rest.Config, error) {
	switch {
	case kubeconfig != "":
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "":
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("$%s: %w", clientcmd.RecommendedConfigPathEnvVar, err)
		}
		return cfg, nil
	default:
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig, no $%s, and not in a cluster: %w", clientcmd.RecommendedConfigPathEnvVar, err)
		}
		return cfg, nil
	}
}

func writeNetIDs(w io.Writer, rows []ProjectNetID) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tNETID")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\n", r.Name, r.NetID)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("pod-network: write output: %w", err)
	}
	return nil
}

// pendingChange is one project's request while the command waits for the controller.
type pendingChange struct {
	project string
	before  uint32 // NETID when the request was written
	done    bool
	// clearedAt is when the annotation was first seen gone with the NETID not (yet) as asked: a refusal
	// whose Warning Event may still be on its way.
	clearedAt time.Time
}

// refusalGrace is how long a command waits for the Warning Event of a request the controller cleared
// without carrying it out (Events are recorded asynchronously) before it reports the refusal without one.
const refusalGrace = 3 * time.Second

// ChangePodNetwork writes req's change-network annotation on each project's NetNamespace, waits until the
// controller has carried every request out (polling every poll), and returns the NETIDs of req.Listed().
// It fails, naming the project and the reason, when a project has no NetNamespace, when the controller
// refuses a request (a Warning Event on the NetNamespace), or when req.Timeout passes.
func ChangePodNetwork(ctx context.Context, c PodNetworkClients, req PodNetworkRequest, poll time.Duration) ([]ProjectNetID, error) {
	ctx, cancel := context.WithTimeout(ctx, req.Timeout)
	defer cancel()
	value := networkv1.ChangeNetwork{Action: req.Action, Target: req.To}.String()
	if _, err := networkv1.ParseChangeNetwork(value); err != nil {
		return nil, fmt.Errorf("pod-network: %w", err) // unreachable after ParsePodNetworkArgs
	}
	nns := c.Net.NetworkV1().NetNamespaces()

	// Every project must exist before anything is written: a typo changes nothing.
	get := func(p string) (*networkv1.NetNamespace, error) {
		nn, err := nns.Get(ctx, p, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("project %q: no NetNamespace %s (no such project, or the ofsdn controller has not allocated it yet)", p, p)
		}
		if err != nil {
			return nil, fmt.Errorf("project %q: get NetNamespace: %w", p, err)
		}
		return nn, nil
	}
	var pending []*pendingChange
	for _, p := range req.Listed() {
		nn, err := get(p)
		if err != nil {
			return nil, fmt.Errorf("pod-network: %w", err)
		}
		if p != req.To {
			pending = append(pending, &pendingChange{project: p, before: nn.NetID})
		}
	}

	// Warnings that exist now are history; only new ones (or old ones seen again) answer our requests.
	seen, err := warningEvents(ctx, c.Kube)
	if err != nil {
		return nil, fmt.Errorf("pod-network: %w", err)
	}

	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, networkv1.ChangeNetworkAnnotation, value)
	for _, pc := range pending {
		if _, err := nns.Patch(ctx, pc.project, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, fmt.Errorf("pod-network: project %q: write %s=%s: %w", pc.project, networkv1.ChangeNetworkAnnotation, value, err)
		}
	}

	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		now, err := warningEvents(ctx, c.Kube)
		if err != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("pod-network: %w", err)
		}
		left := 0
		for _, pc := range pending {
			if pc.done {
				continue
			}
			if ev := newWarning(seen, now, pc.project); ev != nil {
				return nil, fmt.Errorf("pod-network: project %q: the controller refused %s: %s: %s", pc.project, value, ev.Reason, ev.Message)
			}
			if ctx.Err() == nil {
				if err := checkDone(ctx, c, req, pc); err != nil {
					return nil, fmt.Errorf("pod-network: %w", err)
				}
			}
			if !pc.done {
				left++
			}
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			var waiting []string
			for _, pc := range pending {
				if !pc.done {
					waiting = append(waiting, pc.project)
				}
			}
			return nil, fmt.Errorf("pod-network: project %q: the controller did not carry out %s within %s (still pending: %s): %w",
				waiting[0], value, req.Timeout, strings.Join(waiting, ", "), context.Cause(ctx))
		case <-tick.C:
		}
	}

	var rows []ProjectNetID
	for _, p := range req.Listed() {
		nn, err := get(p)
		if err != nil {
			return nil, fmt.Errorf("pod-network: %w", err)
		}
		rows = append(rows, ProjectNetID{Name: p, NetID: nn.NetID})
	}
	return rows, nil
}

// checkDone marks pc done once the controller cleared its annotation and its NETID is what was asked.
// A cleared annotation with the NETID not as asked is a refusal: after refusalGrace without a Warning
// Event it is reported as one.
func checkDone(ctx context.Context, c PodNetworkClients, req PodNetworkRequest, pc *pendingChange) error {
	nn, err := c.Net.NetworkV1().NetNamespaces().Get(ctx, pc.project, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("project %q: its NetNamespace was deleted while the request was pending", pc.project)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil // the caller reports the timeout
		}
		return fmt.Errorf("project %q: get NetNamespace: %w", pc.project, err)
	}
	if _, pending := nn.Annotations[networkv1.ChangeNetworkAnnotation]; pending {
		return nil
	}
	var ok bool
	var want string
	switch req.Action {
	case networkv1.ChangeNetworkGlobal:
		ok, want = nn.NetID == networkv1.GlobalVNID, "NETID 0"
	case networkv1.ChangeNetworkIsolate:
		// The controller always allocates a fresh NETID, so an unchanged one means nothing was done.
		ok, want = nn.NetID != networkv1.GlobalVNID && nn.NetID != pc.before, fmt.Sprintf("a fresh NETID (had %d)", pc.before)
	case networkv1.ChangeNetworkJoin:
		to, err := c.Net.NetworkV1().NetNamespaces().Get(ctx, req.To, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("project %q: get NetNamespace of --to project %q: %w", pc.project, req.To, err)
		}
		ok, want = nn.NetID == to.NetID, fmt.Sprintf("%s's NETID %d", req.To, to.NetID)
	}
	if ok {
		pc.done = true
		return nil
	}
	if pc.clearedAt.IsZero() {
		pc.clearedAt = time.Now()
		return nil
	}
	if time.Since(pc.clearedAt) >= refusalGrace {
		return fmt.Errorf("project %q: the controller cleared the request without carrying it out: NETID is %d, want %s (see its Events)",
			pc.project, nn.NetID, want)
	}
	return nil
}

// eventKey identifies one sighting of an Event: the recorder updates an Event in place (count,
// lastTimestamp, series) when the same warning repeats.
type eventKey struct {
	uid   types.UID
	count int32
	last  time.Time
}

// warningEvents lists the Warning Events about NetNamespaces, by key. The field selector is repeated
// client-side in newWarning, so a server (or fake) that ignores it does no harm.
func warningEvents(ctx context.Context, kube kubernetes.Interface) (map[eventKey]*corev1.Event, error) {
	sel := fields.Set{"involvedObject.kind": "NetNamespace", "type": corev1.EventTypeWarning}.AsSelector().String()
	list, err := kube.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list NetNamespace Warning Events: %w", err)
	}
	out := make(map[eventKey]*corev1.Event, len(list.Items))
	for i := range list.Items {
		ev := &list.Items[i]
		k := eventKey{uid: ev.UID, count: ev.Count, last: ev.LastTimestamp.Time}
		if ev.Series != nil {
			k.count, k.last = ev.Series.Count, ev.Series.LastObservedTime.Time
		}
		out[k] = ev
	}
	return out, nil
}

// newWarning returns a Warning Event about project's NetNamespace that is in now but was not in seen.
func newWarning(seen, now map[eventKey]*corev1.Event, project string) *corev1.Event {
	var found *corev1.Event
	for k, ev := range now {
		if _, old := seen[k]; old {
			continue
		}
		if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Kind != "NetNamespace" || ev.InvolvedObject.Name != project {
			continue
		}
		if found == nil || ev.LastTimestamp.After(found.LastTimestamp.Time) {
			found = ev
		}
	}
	return found
}
