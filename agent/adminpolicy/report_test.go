package adminpolicy

import (
	"strings"
	"testing"
	"time"

	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// TestReporterTellsChangesAndRepeats: a problem is told once, again after ReportInterval, and its end
// with a Normal Enforced; a policy that stops selecting a pod here is told as enforced too.
func TestReporterTellsChangesAndRepeats(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	now := time.Unix(1000, 0)
	r := NewReporter("n1", rec, klog.Background(), func() time.Time { return now })
	next := func() string {
		select {
		case e := <-rec.Events:
			return e
		default:
			return ""
		}
	}
	bad := Report{"p": {{Reason: ReasonDomainNamesUnsupported, Message: "x"}}}
	r.Report(bad)
	if e := next(); !strings.HasPrefix(e, "Warning "+cnp.EventReasonNotEnforced+" node n1: "+ReasonDomainNamesUnsupported+": x") {
		t.Fatalf("first report: %q", e)
	}
	r.Report(bad)
	if e := next(); e != "" {
		t.Fatalf("repeated at once: %q", e)
	}
	now = now.Add(ReportInterval)
	r.Report(bad)
	if e := next(); !strings.HasPrefix(e, "Warning "+cnp.EventReasonNotEnforced) {
		t.Fatalf("after the interval: %q", e)
	}
	r.Report(Report{"p": nil})
	if e := next(); !strings.HasPrefix(e, "Normal "+cnp.EventReasonEnforced+" node n1 enforces it as written") {
		t.Fatalf("problem gone: %q", e)
	}
	r.Report(bad)
	next()
	r.Report(Report{})
	if e := next(); !strings.HasPrefix(e, "Normal "+cnp.EventReasonEnforced+" node n1 no longer has a pod it selects") {
		t.Fatalf("no longer selecting: %q", e)
	}
}
