// Package loop runs a background job the one way the agent runs all of its own: in a goroutine of
// its own, once at start, again on every Kick (kicks during a run coalesce into one more run), every
// Period, when the job itself asks to run again after a while, and after a failure with exponential
// back-off. An error is logged when it first appears or changes, not on every retry. Between runs the
// loop answers Ping, so a health check can tell a stuck loop from an idle one.
package loop

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// Job does one pass of a loop's work. again > 0 asks for another pass within that time even if nobody
// kicks (a retry that is due, a check to repeat sooner); an error schedules a retry with back-off.
type Job func(ctx context.Context) (again time.Duration, err error)

// Config shapes a loop. The zero value runs the job on kicks only, retrying failures after 50 ms
// doubling to 5 s.
type Config struct {
	Name string // names the loop in its logs
	// Period, when set, runs the job at least this often.
	Period time.Duration
	// FirstAfter delays the first pass (0: at once), for a job with nothing to do at start.
	FirstAfter time.Duration
	// BackoffMin and BackoffMax bound the retries of a failing job (defaults 50 ms and 5 s).
	BackoffMin, BackoffMax time.Duration
	// Quiet says which errors are expected while the job waits for something (a node not ready
	// yet): they are logged at V(2) only.
	Quiet func(error) bool
	Log   klog.Logger
}

// Loop is one background job. Create it with New; Kick and Ping are safe from any goroutine, and on a
// nil Loop (a job a node does not have) they do nothing.
type Loop struct {
	cfg  Config
	job  Job
	kick chan struct{}
	ping chan chan struct{}
}

// New makes a loop for job; Run starts it.
func New(cfg Config, job Job) *Loop {
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 50 * time.Millisecond
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(5*time.Second, cfg.BackoffMin)
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = klog.Background()
	}
	return &Loop{cfg: cfg, job: job, kick: make(chan struct{}, 1), ping: make(chan chan struct{})}
}

// Kick asks for a pass soon; it never blocks, and kicks before a pass starts make one pass.
func (l *Loop) Kick() {
	if l == nil {
		return
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Ping returns once the loop is between passes: at once when it is idle, after the pass when one runs.
// It fails when ctx ends first (a loop stuck in a pass, or not running).
func (l *Loop) Ping(ctx context.Context) error {
	if l == nil {
		return nil
	}
	pong := make(chan struct{})
	select {
	case l.ping <- pong:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-pong:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run runs passes until ctx ends: the first at once (or after FirstAfter), then as Config says.
func (l *Loop) Run(ctx context.Context) {
	if l == nil {
		return
	}
	log := l.cfg.Log.WithValues("loop", l.cfg.Name)
	backoff := l.cfg.BackoffMin
	lastErr := ""
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	if l.cfg.FirstAfter > 0 && !l.wait(ctx, timer, l.cfg.FirstAfter) {
		return
	}
	for {
		again, err := l.job(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := l.cfg.Period
		if again > 0 && (wait <= 0 || again < wait) {
			wait = again
		}
		if err != nil {
			switch {
			case l.cfg.Quiet != nil && l.cfg.Quiet(err):
				log.V(2).Info("waiting", "reason", err.Error(), "retryIn", backoff)
			case err.Error() != lastErr:
				log.Error(err, "pass failed; retrying", "retryIn", backoff)
			default:
				log.V(2).Info("pass failed again", "err", err.Error(), "retryIn", backoff)
			}
			lastErr = err.Error()
			if wait <= 0 || backoff < wait {
				wait = backoff
			}
			backoff = min(2*backoff, l.cfg.BackoffMax)
		} else {
			if lastErr != "" {
				log.Info("pass succeeded again")
			}
			lastErr, backoff = "", l.cfg.BackoffMin
		}
		if !l.wait(ctx, timer, wait) {
			return
		}
	}
}

// wait blocks until a kick, the timer (when wait > 0) or the end of ctx, answering pings meanwhile. It
// reports whether to run again.
func (l *Loop) wait(ctx context.Context, timer *time.Timer, wait time.Duration) bool {
	timer.Stop()
	var fire <-chan time.Time
	if wait > 0 {
		timer.Reset(wait)
		fire = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-l.kick:
			return true
		case <-fire:
			return true
		case pong := <-l.ping:
			close(pong)
		}
	}
}
