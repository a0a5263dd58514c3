// Command ofsdn is the CNI plugin (type "ofsdn"): it forwards every call to the node's ofsdn agent.
package main

import "github.com/ofsdn/ofsdn/cni"

func main() { cni.PluginMain() }
