package v1

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ChangeNetworkAction is what a change-network annotation asks for.
type ChangeNetworkAction string

// The three requests of `flowctl pod-network` (openshift-sdn's `oc adm pod-network`).
const (
	ChangeNetworkJoin    ChangeNetworkAction = "join"
	ChangeNetworkIsolate ChangeNetworkAction = "isolate"
	ChangeNetworkGlobal  ChangeNetworkAction = "global"
)

// ChangeNetwork is a parsed change-network annotation.
type ChangeNetwork struct {
	Action ChangeNetworkAction
	// Target is the namespace to join (Join only).
	Target string
}

// String is the annotation value that asks for c.
func (c ChangeNetwork) String() string {
	if c.Action == ChangeNetworkJoin {
		return string(ChangeNetworkJoin) + ":" + c.Target
	}
	return string(c.Action)
}

// ParseChangeNetwork parses an annotation value: "join:<namespace>", "isolate" or "global".
func ParseChangeNetwork(value string) (ChangeNetwork, error) {
	switch {
	case value == string(ChangeNetworkIsolate):
		return ChangeNetwork{Action: ChangeNetworkIsolate}, nil
	case value == string(ChangeNetworkGlobal):
		return ChangeNetwork{Action: ChangeNetworkGlobal}, nil
	case strings.HasPrefix(value, string(ChangeNetworkJoin)+":"):
		target := strings.TrimPrefix(value, string(ChangeNetworkJoin)+":")
		if errs := validation.IsDNS1123Label(target); len(errs) > 0 {
			return ChangeNetwork{}, fmt.Errorf("change-network %q: %q is not a namespace name: %s", value, target, strings.Join(errs, "; "))
		}
		return ChangeNetwork{Action: ChangeNetworkJoin, Target: target}, nil
	default:
		return ChangeNetwork{}, fmt.Errorf("change-network %q: want join:<namespace>, isolate or global", value)
	}
}
