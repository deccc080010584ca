// Command katib-experiment-controller runs Katib's own Experiment controller
// (github.com/kubeflow/katib pkg/controller.v1beta1/experiment, v0.19.0) against the test
// kube-apiserver, for nodeguard's Katib pause tests. Only that controller runs: no webhooks,
// no Trial controller and no Suggestion controller; the tests play those parts by writing
// Trial and Suggestion status, so what is tested is exactly how the Experiment controller
// creates and deletes Trials (ReconcileTrials, createTrials, deleteTrials).
package main

import (
	"flag"
	"os"

	"github.com/spf13/viper"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	configv1beta1 "github.com/kubeflow/katib/pkg/apis/config/v1beta1"
	apis "github.com/kubeflow/katib/pkg/apis/controller"
	"github.com/kubeflow/katib/pkg/controller.v1beta1/consts"
	"github.com/kubeflow/katib/pkg/controller.v1beta1/experiment"
)

func main() {
	flag.Parse() // --kubeconfig is controller-runtime's own flag (pkg/client/config)
	logf.SetLogger(zap.New(zap.UseDevMode(false)))
	log := logf.Log.WithName("katib-experiment-controller")

	scheme := runtime.NewScheme()
	utilruntime.Must(apis.AddToScheme(scheme))
	utilruntime.Must(configv1beta1.AddToScheme(scheme))
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	viper.Set(consts.ConfigExperimentSuggestionName, "default")

	cfg, err := config.GetConfig()
	if err != nil {
		log.Error(err, "kubeconfig")
		os.Exit(1)
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		log.Error(err, "manager")
		os.Exit(1)
	}
	if err := experiment.Add(mgr); err != nil {
		log.Error(err, "experiment controller")
		os.Exit(1)
	}
	log.Info("starting")
	if err := mgr.Start(signals.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}
