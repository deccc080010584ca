// Command kube-controller-manager mirrors k8s.io/kubernetes/cmd/kube-controller-manager/controller-manager.go.
// The tests run it with only the controllers they need (--controllers=resourcequota,...), so a
// ResourceQuota's status.used is computed as in a real cluster.
package main

import (
	"os"
	_ "time/tzdata" // for CronJob time zone support, as upstream

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
