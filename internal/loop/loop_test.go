package loop

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
)

// recorder is a job that counts its passes and reports each on a channel.
type recorder struct {
	mu     sync.Mutex
	passes int
	errs   []error       // the error of pass i (none past the end)
	again  time.Duration // asked of every pass
	block  chan struct{} // when set, a pass waits for it
	passed chan int
}

func (r *recorder) job(ctx context.Context) (time.Duration, error) {
	if r.block != nil {
		select {
		case <-r.block:
		case <-ctx.Done():
		}
	}
	r.mu.Lock()
	n := r.passes
	r.passes++
	var err error
	if n < len(r.errs) {
		err = r.errs[n]
	}
	r.mu.Unlock()
	r.passed <- n
	return r.again, err
}

func newRecorder() *recorder { return &recorder{passed: make(chan int, 100)} }

// next waits for the next pass, failing the test after a generous bound (not a timing check: a pass
// that never comes).
func (r *recorder) next(t *testing.T) int {
	t.Helper()
	select {
	case n := <-r.passed:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no pass came")
		return -1
	}
}

// none checks that no pass comes for a while.
func (r *recorder) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case n := <-r.passed:
		t.Fatalf("unexpected pass %d", n)
	case <-time.After(d):
	}
}

func start(t *testing.T, cfg Config, job Job) *Loop {
	t.Helper()
	l := New(cfg, job)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

func TestRunsAtStartAndOnKicks(t *testing.T) {
	r := newRecorder()
	l := start(t, Config{Name: "t"}, r.job)
	if r.next(t) != 0 {
		t.Fatal("first pass is not pass 0")
	}
	r.none(t, 50*time.Millisecond) // no period, no kick: idle
	l.Kick()
	r.next(t)
	r.none(t, 50*time.Millisecond)
}

func TestFirstAfterDelaysTheFirstPass(t *testing.T) {
	r := newRecorder()
	l := start(t, Config{Name: "t", FirstAfter: time.Hour}, r.job)
	r.none(t, 50*time.Millisecond)
	l.Kick() // a kick does not wait for it
	if r.next(t) != 0 {
		t.Fatal("first pass is not pass 0")
	}
}

func TestKicksDuringAPassCoalesce(t *testing.T) {
	r := newRecorder()
	r.block = make(chan struct{})
	l := start(t, Config{Name: "t"}, r.job)
	for range 5 {
		l.Kick()
	}
	close(r.block) // the first pass ends after five kicks
	r.next(t)
	r.next(t) // one more pass for all five
	r.none(t, 50*time.Millisecond)
}

func TestPeriodAndAgain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		again  time.Duration
		passes int
	}{
		{"period", Config{Period: 5 * time.Millisecond}, 0, 4},
		{"the job asks again", Config{}, 5 * time.Millisecond, 4},
		{"again sooner than the period", Config{Period: time.Hour}, 5 * time.Millisecond, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			r.again = tc.again
			start(t, tc.cfg, r.job)
			for range tc.passes {
				r.next(t)
			}
		})
	}
}

func TestFailuresRetryAndLogOncePerError(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{Verbosity: 0})
	boom, bang := errors.New("boom"), errors.New("bang")
	r := newRecorder()
	r.errs = []error{boom, boom, boom, bang, nil}
	start(t, Config{Name: "t", BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond, Log: klog.Logger(log)}, r.job)
	for range 5 { // four failures retried without any kick, then a success
		r.next(t)
	}
	r.none(t, 50*time.Millisecond) // success: back to idle
	mu.Lock()
	defer mu.Unlock()
	got := strings.Join(lines, "\n")
	if strings.Count(got, `"boom"`) != 1 || strings.Count(got, `"bang"`) != 1 || strings.Count(got, "succeeded again") != 1 {
		t.Errorf("want one line per distinct error and one for the recovery, got:\n%s", got)
	}
}

func TestQuietErrorsAreNotErrors(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(_, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{})
	waiting := errors.New("not ready")
	r := newRecorder()
	r.errs = []error{waiting, nil}
	start(t, Config{Name: "t", BackoffMin: time.Millisecond, Quiet: func(err error) bool { return errors.Is(err, waiting) }, Log: klog.Logger(log)}, r.job)
	r.next(t)
	r.next(t)
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(strings.Join(lines, "\n"), "not ready") {
		t.Errorf("a quiet error was logged at the default level: %v", lines)
	}
}

func TestPingWaitsForThePass(t *testing.T) {
	r := newRecorder()
	r.block = make(chan struct{})
	l := start(t, Config{Name: "t"}, r.job)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Ping(ctx); err == nil {
		t.Fatal("ping answered while a pass is stuck")
	}
	close(r.block)
	r.next(t)
	if err := l.Ping(context.Background()); err != nil {
		t.Fatalf("idle loop does not answer: %v", err)
	}
}

func TestNilLoopDoesNothing(t *testing.T) {
	var l *Loop
	l.Kick()
	l.Run(context.Background())
	if err := l.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}
