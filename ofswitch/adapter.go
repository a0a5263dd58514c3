package ofswitch

import "context"

// SwitchAdapter presents a Session as reconcile.Switch (cookie/mask dumps over all tables). It is a
// separate type so that ofswitch need not import flows/reconcile, whose own tests use ofswitch.
type SwitchAdapter struct{ *Session }

// FlowsSwitch adapts s for reconcile.New.
func FlowsSwitch(s *Session) SwitchAdapter { return SwitchAdapter{s} }

// DumpFlows dumps the flows of every table whose cookie matches cookie/mask.
func (a SwitchAdapter) DumpFlows(ctx context.Context, cookie, mask uint64) ([][]byte, error) {
	return a.Session.DumpFlows(ctx, FlowFilter{TableID: 0xff, Cookie: cookie, CookieMask: mask})
}
