package controller

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderConfig names the coordination.k8s.io Lease the replicas compete for.
type LeaderConfig struct {
	Namespace, Name string
	Identity        string
	LeaseDuration   time.Duration // default 15s: how long a dead leader's lease blocks the others
	RenewDeadline   time.Duration // default 10s
	RetryPeriod     time.Duration // default 2s
}

// RunLeader runs c while this replica holds the Lease; it returns when ctx ends (releasing the Lease, so
// a graceful stop hands over at once) or when leadership is lost (the process should then exit and
// restart as a follower, as client-go intends).
func RunLeader(ctx context.Context, kube kubernetes.Interface, lc LeaderConfig, c *Controller) error {
	if lc.LeaseDuration == 0 {
		lc.LeaseDuration = 15 * time.Second
	}
	if lc.RenewDeadline == 0 {
		lc.RenewDeadline = 10 * time.Second
	}
	if lc.RetryPeriod == 0 {
		lc.RetryPeriod = 2 * time.Second
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metaFor(lc),
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: lc.Identity},
	}
	log := c.log.WithValues("lease", lc.Namespace+"/"+lc.Name, "identity", lc.Identity)
	var runErr error
	lost := false
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: lc.LeaseDuration, RenewDeadline: lc.RenewDeadline, RetryPeriod: lc.RetryPeriod,
		ReleaseOnCancel: true, Name: lc.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("leading")
				c.metrics.IsLeader.Set(1)
				runErr = c.Run(ctx)
			},
			OnStoppedLeading: func() {
				c.metrics.IsLeader.Set(0)
				if ctx.Err() == nil {
					lost = true
				}
				log.Info("stopped leading")
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
	if runErr != nil {
		return runErr
	}
	if lost {
		return fmt.Errorf("controller: lost the lease %s/%s", lc.Namespace, lc.Name)
	}
	return nil
}

func metaFor(lc LeaderConfig) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: lc.Namespace, Name: lc.Name}
}
