package metrics

import (
	"context"
	"errors"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// cniStub answers each verb with a set error.
type cniStub struct{ err error }

func (s cniStub) Add(context.Context, *cni.Request) (*current.Result, error) { return nil, s.err }
func (s cniStub) Del(context.Context, *cni.Request) error                    { return s.err }
func (s cniStub) Check(context.Context, *cni.Request) error                  { return s.err }
func (s cniStub) Status(context.Context) error                               { return s.err }
func (s cniStub) GC(context.Context, []cni.Attachment) error                 { return s.err }

// TestCNIMetrics: every verb is counted and timed by its result: ok, the CNI code of a CNI error, 50
// for a failed STATUS (the code the server answers it with), 999 for anything else.
func TestCNIMetrics(t *testing.T) {
	m := New(nil)
	ctx := context.Background()
	ok := CNIHandler{cniStub{}, m}
	_, _ = ok.Add(ctx, &cni.Request{})
	_, _ = ok.Add(ctx, &cni.Request{})
	_ = ok.Del(ctx, &cni.Request{})
	busy := CNIHandler{cniStub{cni.Errorf(cni.ErrTryAgainLater, "busy")}, m}
	_, _ = busy.Add(ctx, &cni.Request{})
	plain := CNIHandler{cniStub{errors.New("no subnet")}, m}
	_ = plain.Status(ctx)
	_ = plain.GC(ctx, nil)
	for _, c := range []struct {
		verb, result string
		want         float64
	}{{"ADD", "ok", 2}, {"DEL", "ok", 1}, {"ADD", "11", 1}, {"STATUS", "50", 1}, {"GC", "999", 1}, {"CHECK", "ok", 0}} {
		if got := testutil.ToFloat64(m.CNIRequests.WithLabelValues(c.verb, c.result)); got != c.want {
			t.Errorf("%s %s counted %v, want %v", c.verb, c.result, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.CNIDuration); n != 5 {
		t.Errorf("%d latency series, want one per verb and result seen (5)", n)
	}
}
