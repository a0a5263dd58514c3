// Package conformance runs Kubernetes' own network e2e tests (e2e.test and ginkgo at the control
// plane's version, hack/build-k8s-e2e.sh) against the lab on real kubelets (e2e/cluster with
// Options.Kubelets, CoreDNS as cluster DNS), once per ofsdn plugin mode, and reports every selected
// test as passed, failed, or skipped with the reason: a skip rule of this package (a property of the
// lab, e.g. no cloud load balancer), or the framework's own skip message.
package conformance

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/labimages"
	"github.com/ofsdn/ofsdn/lab/kubelab"
)

// Suite is a set of upstream tests, chosen by a regular expression over their full names.
type Suite struct {
	Name  string
	Focus string
	// Modes the suite applies to; empty: every mode.
	Modes []networkv1.PluginMode
}

// Suites are what make conformance runs: the [sig-network] [Conformance] tests, the Services tests and
// the NetworkPolicy tests (enforced in networkpolicy mode only: multitenant and subnet modes isolate by
// VNID or not at all, by design).
var Suites = []Suite{
	{Name: "Conformance", Focus: `\[sig-network\].*\[Conformance\]`},
	{Name: "Services", Focus: `\[sig-network\] Services `},
	{Name: "Netpol", Focus: `\[sig-network\] Netpol `, Modes: []networkv1.PluginMode{networkv1.PluginModeNetworkPolicy}},
}

// Rule skips the tests whose names match Pattern, for Reason: something the lab does not have, never
// something ofsdn gets wrong.
type Rule struct {
	Pattern string
	Reason  string
}

// Rules are the lab's skips.
var Rules = []Rule{
	{`\[Disruptive\]`, "restarts the API server or kube-proxy on a control-plane node over SSH: the lab's control plane are processes on this machine (no SSH), and ofsdn replaces kube-proxy"},
	{`LoadBalancer`, "needs a cloud load balancer: the lab has no cloud provider"},
	{`\[Feature:SCTPConnectivity\]`, "SCTP through NetworkPolicy: the lab's Open vSwitch is the userspace datapath, whose conntrack keys SCTP on addresses only (README: NetworkPolicy, SCTP)"},
	{`connect to a service via ExternalIP`, "sends to 203.0.113.250, in the range this lab must never use (the machine's package registries resolve there); ofsdn does not implement Service externalIPs yet either (README)"},
}

// Options shape a run.
type Options struct {
	Modes []networkv1.PluginMode
	// Suites to run; default Suites.
	Suites []Suite
	// Only further restricts every suite to tests matching it (a CI subset); empty: no restriction.
	Only string
	// Rules are the skips; default Rules.
	Rules []Rule
	// Procs is ginkgo's parallelism; default 3.
	Procs int
	// BinDir holds e2e.test, ginkgo and coredns; default $OFSDN_K8S_E2E_BIN or _output/k8s/e2e.
	BinDir string
	// OutDir receives each mode's JUnit report and ginkgo's output; default a temp dir.
	OutDir string
	// Timeout bounds each mode's ginkgo run; default 90 minutes.
	Timeout time.Duration
	// Progress receives ginkgo's output as it runs; nil discards it (it is in OutDir either way).
	Progress io.Writer
	Logger   *slog.Logger
}

// State of a test.
type State string

const (
	Passed  State = "passed"
	Failed  State = "failed"
	Skipped State = "skipped"
)

// Result is one test in one mode.
type Result struct {
	Mode     networkv1.PluginMode
	Suite    string
	Name     string
	State    State
	Reason   string // why it was skipped, or the failure's first line
	Duration time.Duration
}

// BinDir finds e2e.test, ginkgo and coredns.
func BinDir() (string, error) {
	dir := os.Getenv("OFSDN_K8S_E2E_BIN")
	if dir == "" {
		root, err := kubelab.RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "_output", "k8s", "e2e")
	}
	for _, b := range []string{"e2e.test", "ginkgo", "coredns"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("conformance: %s is missing: run `make k8s-e2e-bins` (hack/build-k8s-e2e.sh)", filepath.Join(dir, b))
		}
	}
	return dir, nil
}

// Run runs the suites in every mode, each mode on a fresh lab cluster, and returns every selected
// test's result.
func Run(ctx context.Context, opts Options) ([]Result, error) {
	if len(opts.Suites) == 0 {
		opts.Suites = Suites
	}
	if opts.Rules == nil {
		opts.Rules = Rules
	}
	if opts.Procs == 0 {
		opts.Procs = 3
	}
	if opts.Timeout == 0 {
		opts.Timeout = 90 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	var err error
	if opts.BinDir == "" {
		if opts.BinDir, err = BinDir(); err != nil {
			return nil, err
		}
	}
	if opts.OutDir == "" {
		if opts.OutDir, err = os.MkdirTemp("", "ofsdn-conformance-"); err != nil {
			return nil, fmt.Errorf("conformance: %w", err)
		}
	}
	// ginkgo and e2e.test run in the report directory: every path they get is absolute.
	if opts.OutDir, err = filepath.Abs(opts.OutDir); err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	if opts.BinDir, err = filepath.Abs(opts.BinDir); err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	var all []Result
	for _, mode := range opts.Modes {
		res, err := runMode(ctx, opts, mode)
		all = append(all, res...)
		if err != nil {
			return all, err
		}
	}
	return all, nil
}

// suitesFor lists the suites that apply to mode.
func suitesFor(opts Options, mode networkv1.PluginMode) []Suite {
	var out []Suite
	for _, s := range opts.Suites {
		if len(s.Modes) == 0 || slices.Contains(s.Modes, mode) {
			out = append(out, s)
		}
	}
	return out
}

func runMode(ctx context.Context, opts Options, mode networkv1.PluginMode) ([]Result, error) {
	log := opts.Logger.With("mode", mode)
	suites := suitesFor(opts, mode)
	if len(suites) == 0 {
		return nil, nil
	}
	began := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{Kubelets: true, TestImages: true, Mode: mode, CoreDNS: filepath.Join(opts.BinDir, "coredns"), Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	defer c.Stop()
	if err := DeployDNS(ctx, c); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, c.Logs(30))
	}
	log.Info("cluster and DNS up", "took", time.Since(began).Round(time.Second))

	dir := filepath.Join(opts.OutDir, string(mode))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	repoList := filepath.Join(dir, "repo-list.yaml")
	if err := os.WriteFile(repoList, []byte(labimages.RepoList()), 0o644); err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	var focus []string
	for _, s := range suites {
		focus = append(focus, s.Focus)
	}
	var skips []string
	for _, r := range opts.Rules {
		skips = append(skips, r.Pattern)
	}
	kbin, err := kubelab.BinDir()
	if err != nil {
		return nil, err
	}
	kubectl := filepath.Join(kbin, "kubectl") // the suite's version, not whatever kubectl PATH has
	junit := filepath.Join(dir, "junit.xml")
	runFocus := strings.Join(focus, "|")
	if opts.Only != "" {
		runFocus = opts.Only // ginkgo ORs focuses: run Only, and keep only the suites' tests when reading results
	}
	args := []string{"run", "--procs=" + strconv.Itoa(opts.Procs), "--timeout=" + opts.Timeout.String(), "--no-color",
		"--junit-report=" + junit, "--focus=" + runFocus}
	if len(skips) > 0 {
		args = append(args, "--skip="+strings.Join(skips, "|"))
	}
	args = append(args, filepath.Join(opts.BinDir, "e2e.test"), "--",
		"--kubeconfig="+c.API.KubeconfigPath(), "--kubectl-path="+kubectl, "--provider=local", "--num-nodes="+strconv.Itoa(len(c.Nodes)),
		"--dns-domain=cluster.local", "--report-dir="+dir, "--disable-log-dump", "--minStartupPods=0", "--allowed-not-ready-nodes=0")
	cmd := exec.CommandContext(ctx, filepath.Join(opts.BinDir, "ginkgo"), args...)
	// Interrupted, ginkgo still reports what ran (and e2e.test cleans up its namespaces); ginkgo and its
	// e2e.test processes are one process group, which goes whole once ginkgo is done.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
	cmd.WaitDelay = time.Minute
	cmd.Dir = dir
	// The lab's image registry (labimages): names and tags stay the framework's, nothing is pulled.
	cmd.Env = append(os.Environ(), "KUBE_TEST_REPO_LIST="+repoList, "KUBECONFIG="+c.API.KubeconfigPath())
	logf, err := os.Create(filepath.Join(dir, "ginkgo.log"))
	if err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = io.MultiWriter(logf, opts.Progress), io.MultiWriter(logf, opts.Progress)
	log.Info("running e2e.test", "focus", runFocus, "procs", opts.Procs, "report", junit)
	runErr := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // an e2e.test ginkgo left behind
	}
	res, err := ReadJUnit(junit, mode, suites, opts.Only, opts.Rules)
	if err != nil {
		return nil, fmt.Errorf("conformance: %s mode: ginkgo: %v; %w (log %s)", mode, runErr, err, logf.Name())
	}
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		return res, fmt.Errorf("conformance: %s mode: ginkgo: %w", mode, runErr)
	}
	log.Info("mode done", "took", time.Since(began).Round(time.Second))
	return res, nil
}

// junitSuites is what ginkgo writes with --junit-report.
type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Time    float64 `xml:"time,attr"`
			Status  string  `xml:"status,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// Report reads the JUnit reports a Run left in outDir for each mode, as Run would return them.
func Report(outDir string, modes []networkv1.PluginMode, opts Options) ([]Result, error) {
	if len(opts.Suites) == 0 {
		opts.Suites = Suites
	}
	if opts.Rules == nil {
		opts.Rules = Rules
	}
	var all []Result
	for _, m := range modes {
		res, err := ReadJUnit(filepath.Join(outDir, string(m), "junit.xml"), m, suitesFor(opts, m), opts.Only, opts.Rules)
		if err != nil {
			return all, err
		}
		all = append(all, res...)
	}
	return all, nil
}

// ReadJUnit reads ginkgo's JUnit report and returns the results of the tests the suites select (and
// Only, when set): those a rule skips with the rule's reason, the others as the report says.
func ReadJUnit(path string, mode networkv1.PluginMode, suites []Suite, only string, rules []Rule) ([]Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var js junitSuites
	if err := xml.Unmarshal(data, &js); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	var onlyRE *regexp.Regexp
	if only != "" {
		if onlyRE, err = regexp.Compile(only); err != nil {
			return nil, err
		}
	}
	type compiled struct {
		re     *regexp.Regexp
		reason string
	}
	var rs []compiled
	for _, r := range rules {
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", r.Pattern, err)
		}
		rs = append(rs, compiled{re, r.Reason})
	}
	seen := map[string]bool{}
	var out []Result
	for _, s := range js.Suites {
		for _, tc := range s.Cases {
			name := testName(tc.Name)
			suite := ""
			for _, su := range suites {
				if regexp.MustCompile(su.Focus).MatchString(name) {
					suite = su.Name
					break
				}
			}
			if suite == "" || (onlyRE != nil && !onlyRE.MatchString(name)) || seen[name] {
				continue
			}
			seen[name] = true
			r := Result{Mode: mode, Suite: suite, Name: name, Duration: time.Duration(tc.Time * float64(time.Second))}
			rule := ""
			for _, c := range rs {
				if c.re.MatchString(name) {
					rule = c.reason
					break
				}
			}
			switch {
			case rule != "":
				r.State, r.Reason = Skipped, rule
			case tc.Failure != nil:
				r.State, r.Reason = Failed, firstLine(tc.Failure.Message+"\n"+tc.Failure.Text)
			case tc.Error != nil:
				r.State, r.Reason = Failed, firstLine(tc.Error.Message)
			case tc.Skipped != nil || tc.Status == "skipped":
				r.State = Skipped
				if tc.Skipped != nil {
					r.Reason = skipReason(tc.Skipped.Message)
				}
			default:
				r.State = Passed
			}
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// labelSuffix is the list of labels ginkgo appends to a test's name in its JUnit report.
var labelSuffix = regexp.MustCompile(` \[sig-[^\]]*\]$`)

// testName is a JUnit test case's name as the e2e suite lists it: no "[It]", no label list.
func testName(junit string) string {
	return labelSuffix.ReplaceAllString(strings.TrimSpace(strings.TrimPrefix(junit, "[It]")), "")
}

// pathFlags and paths are what a failure message says about where things ran; the table leaves both
// out (kubectl --server=... --kubeconfig=... becomes kubectl).
var (
	pathFlags = regexp.MustCompile(` --(server|kubeconfig)=\S+`)
	paths     = regexp.MustCompile(`(/[\w.+-]+)+/([\w.+-]+)`)
)

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && l != "[FAILED]" {
			l = pathFlags.ReplaceAllString(strings.TrimPrefix(l, "[FAILED] "), "")
			return paths.ReplaceAllString(l, "$2")
		}
	}
	return ""
}

// skipReason makes the framework's skip message one readable line.
func skipReason(msg string) string {
	msg = strings.TrimPrefix(strings.TrimSpace(msg), "skipped - ")
	return firstLine(msg)
}

// Counts sums results by state.
func Counts(rs []Result) (passed, failed, skipped int) {
	for _, r := range rs {
		switch r.State {
		case Passed:
			passed++
		case Failed:
			failed++
		case Skipped:
			skipped++
		}
	}
	return
}

// Table formats the results as a Markdown table (mode, suite, test, result, reason) and ends with the
// line "conformance: N passed, M failed, K skipped".
func Table(rs []Result) string {
	var b strings.Builder
	b.WriteString("| mode | suite | test | result | reason |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		name := strings.ReplaceAll(r.Name, "|", `\|`)
		reason := strings.ReplaceAll(r.Reason, "|", `\|`)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Mode, r.Suite, name, r.State, reason)
	}
	p, f, s := Counts(rs)
	fmt.Fprintf(&b, "\nconformance: %d passed, %d failed, %d skipped\n", p, f, s)
	return b.String()
}
