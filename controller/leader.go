package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Leader election defaults: Kubernetes' own (kube-controller-manager, kube-scheduler). A replica that
// cannot renew for RenewDeadline stops leading; a lease nobody renews blocks other replicas for
// LeaseDuration; candidates retry every RetryPeriod.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// LeaderConfig names the coordination.k8s.io Lease the replicas compete for.
type LeaderConfig struct {
	Namespace, Name string
	// Identity names this replica in the Lease. It must be unique among live replicas and should stay
	// the same across restarts of one replica (DefaultIdentity: the pod's name): a restarted replica
	// whose identity still holds the Lease takes it back at once, instead of waiting LeaseDuration for
	// its own dead predecessor's lease to expire.
	Identity      string
	LeaseDuration time.Duration // default DefaultLeaseDuration
	RenewDeadline time.Duration // default DefaultRenewDeadline
	RetryPeriod   time.Duration // default DefaultRetryPeriod
}

// DefaultIdentity is $POD_NAME (deploy/ sets it from the downward API): unique among the Deployment's
// replicas and the same across restarts of a pod's container. Outside a pod it is hostname_pid, unique
// but new for every process (a restarted process then waits for its predecessor's lease to expire).
func DefaultIdentity() string {
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return pod
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s_%d", host, os.Getpid())
}

// ErrLeaseLost is returned by RunLeader when this replica stopped leading while still asked to run.
var ErrLeaseLost = errors.New("lost the lease")

// RunLeader runs c while this replica holds the Lease. It returns nil when ctx ends, and ErrLeaseLost
// (wrapped) when leadership was lost: the API server was unreachable for RenewDeadline, or another
// replica holds the Lease. The process should then exit and start over as a candidate, as client-go
// intends (a Deployment restarts it); a fresh process rebuilds its state from the API.
//
// Either way the controller's work has stopped before RunLeader returns, and only then is the Lease
// released (if this replica still holds it): a replica that stops on purpose hands over at once, and no
// two replicas ever act together. After a lost lease the release is tried once; it fails while the API
// server is away, and then the stable Identity lets the restarted replica take the Lease back at once.
func RunLeader(ctx context.Context, kube kubernetes.Interface, lc LeaderConfig, c *Controller) error {
	if lc.Identity == "" {
		return errors.New("controller: leader election: empty identity")
	}
	if lc.LeaseDuration == 0 {
		lc.LeaseDuration = DefaultLeaseDuration
	}
	if lc.RenewDeadline == 0 {
		lc.RenewDeadline = DefaultRenewDeadline
	}
	if lc.RetryPeriod == 0 {
		lc.RetryPeriod = DefaultRetryPeriod
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: lc.Namespace, Name: lc.Name},
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: lc.Identity},
	}
	log := c.log.WithValues("lease", lc.Namespace+"/"+lc.Name, "identity", lc.Identity)
	var runErr error // c.Run's; read only after ran is closed
	launched, ran := make(chan struct{}), make(chan struct{})
	lost := false
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: lc.LeaseDuration, RenewDeadline: lc.RenewDeadline, RetryPeriod: lc.RetryPeriod,
		// client-go would release right after its renew loop ends, while c.Run may still be writing:
		// RunLeader releases itself once c.Run has returned.
		ReleaseOnCancel: false, Name: lc.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				defer close(ran)
				close(launched)
				if ctx.Err() != nil {
					return // le.Run returned before this goroutine started: nothing to lead
				}
				log.Info("leading")
				c.metrics.IsLeader.Set(1)
				runErr = c.Run(ctx)
			},
			OnStoppedLeading: func() {
				c.metrics.IsLeader.Set(0)
				if ctx.Err() == nil {
					lost = true
				}
				log.Info("stopped leading", "lost", lost)
			},
			OnNewLeader: func(id string) {
				if id != lc.Identity {
					log.Info("following", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("controller: leader election: %w", err)
	}
	le.Run(ctx)
	// le.Run starts OnStartedLeading in a goroutine of its own once it holds the Lease, and returns
	// before ctx ends only after it held it: then c.Run runs or is about to. When ctx ended, c.Run ran
	// if it was launched; one launched later sees a cancelled context and does nothing.
	leading := ctx.Err() == nil
	select {
	case <-launched:
		leading = true
	default:
	}
	var ranErr error
	if leading {
		// client-go has cancelled c.Run's context: wait for the workers, but not forever. A controller
		// that does not stop must not get a second leader beside it: the Lease then expires instead.
		select {
		case <-ran:
			ranErr = runErr
		case <-time.After(lc.RenewDeadline):
			return fmt.Errorf("controller: the controller did not stop within %s; leaving the lease %s/%s to expire",
				lc.RenewDeadline, lc.Namespace, lc.Name)
		}
	}
	// Nothing of this replica runs any more: give the Lease up if it names this identity (it may from
	// a predecessor too), so another replica or this one's restart takes it at once.
	switch released, err := releaseLease(lock, lc); {
	case err != nil:
		log.Info("could not release the lease; it expires on its own", "err", err)
	case released:
		log.Info("released the lease")
	}
	if ranErr != nil {
		return ranErr
	}
	if lost {
		return fmt.Errorf("controller: %w %s/%s", ErrLeaseLost, lc.Namespace, lc.Name)
	}
	return nil
}

// releaseLease gives the Lease up if this replica still holds it: no holder, a one-second duration
// (client-go's own release record, which every candidate takes at once). The Update carries the
// resourceVersion just read, so a Lease another replica took in between is never overwritten.
func releaseLease(lock *resourcelock.LeaseLock, lc LeaderConfig) (released bool, _ error) {
	ctx, cancel := context.WithTimeout(context.Background(), lc.RenewDeadline)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	if rec.HolderIdentity != lc.Identity {
		return false, nil // someone else holds it, or nobody: not ours to release
	}
	now := metav1.NewTime(time.Now())
	err = lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaderTransitions: rec.LeaderTransitions, LeaseDurationSeconds: 1,
		RenewTime: now, AcquireTime: now})
	return err == nil, err
}
