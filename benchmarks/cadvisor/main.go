// cadvisor-peer: cAdvisor as the kubelet embeds it, for nodeguard's benchmarks.
//
// The library module github.com/google/cadvisor/lib (the one the kubelet links), wired the way
// the kubelet wires it (pkg/kubelet/cadvisor/cadvisor_linux.go, pkg/kubelet/server/server.go):
// an in-memory stats cache of 2 minutes, a 10 s housekeeping interval with dynamic
// housekeeping up to 15 s, no event storage, the raw cgroup handler only (no containerd or
// CRI-O handler, so series carry the cgroup path and blank workload labels), and a
// /metrics endpoint with the kubelet's request options (the latest stats of every container,
// recursively). Metrics: memory and OOM events only, what nodeguard exports, so that the two
// are compared on the same job.
//
// The library no longer watches the kernel log for OOM kills: the kubelet's OOM watcher
// (pkg/kubelet/oom) and the cAdvisor binary do it themselves. Here the root module's
// utils/oomparser reads /dev/kmsg and each kill is counted on the cgroup that hit its limit,
// which is what container_oom_events_total reports.
//
// Usage: cadvisor-peer -listen 127.0.0.1:PORT -cgroup-root /kubepods [-cgroup-root ...]
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/cadvisor/lib/cache/memory"
	"github.com/google/cadvisor/lib/container"
	"github.com/google/cadvisor/lib/manager"
	"github.com/google/cadvisor/lib/metrics"
	info "github.com/google/cadvisor/lib/model"
	"github.com/google/cadvisor/lib/utils/sysfs"
	"github.com/google/cadvisor/utils/oomparser"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"
)

type roots []string

func (r *roots) String() string     { return strings.Join(*r, ",") }
func (r *roots) Set(v string) error { *r = append(*r, v); return nil }

// oomCounts: OOM kills per cgroup (the one whose limit was hit), from the kernel log.
type oomCounts struct {
	mu    sync.Mutex
	kills map[string]uint64
}

func (o *oomCounts) watch() {
	parser, err := oomparser.New()
	if err != nil {
		log.Printf("no OOM events (kernel log not readable): %v", err)
		return
	}
	found := make(chan *oomparser.OomInstance, 16)
	go parser.StreamOoms(found)
	go func() {
		for kill := range found {
			o.mu.Lock()
			o.kills[kill.ContainerName]++
			o.mu.Unlock()
		}
	}()
}

// withOOMs answers the collector's queries with each container's OOM count filled in.
type withOOMs struct {
	manager.Manager
	counts *oomCounts
}

func (w withOOMs) GetRequestedContainersInfo(name string, opts info.RequestOptions) (map[string]*info.ContainerInfo, error) {
	infos, err := w.Manager.GetRequestedContainersInfo(name, opts)
	w.counts.mu.Lock()
	defer w.counts.mu.Unlock()
	for _, c := range infos {
		for _, s := range c.Stats {
			s.OOMEvents = w.counts.kills[c.Name]
		}
	}
	return infos, err
}

// kubeletLabels: the label set of the kubelet's /metrics/cadvisor (id, name, image and the
// workload labels, blank where the raw handler does not know them).
func kubeletLabels(c *info.ContainerInfo) map[string]string {
	set := map[string]string{"id": c.Name, "name": "", "image": "", "container": "", "pod": "", "namespace": ""}
	if len(c.Aliases) > 0 {
		set["name"] = c.Aliases[0]
	}
	return set
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to serve /metrics on")
	var cgroupRoots roots
	flag.Var(&cgroupRoots, "cgroup-root", "raw cgroup prefix to watch (repeatable; the kubelet's cgroup roots)")
	flag.Parse()
	for name, value := range map[string]string{
		"housekeeping_interval":     "10s",
		"event_storage_event_limit": "default=0",
		"event_storage_age_limit":   "default=0",
	} {
		if err := flag.Set(name, value); err != nil {
			log.Fatalf("flag %s: %v", name, err)
		}
	}
	included := container.MetricSet{
		container.MemoryUsageMetrics: struct{}{},
		container.OOMMetrics:         struct{}{},
	}
	maxHousekeeping := 15 * time.Second
	dynamic := true
	m, err := manager.New(
		memory.New(2*time.Minute, nil),
		sysfs.NewRealSysFs(),
		manager.HousekeepingConfig{Interval: &maxHousekeeping, AllowDynamic: &dynamic},
		included,
		cgroupRoots,
		nil, // no environment variables as labels
		"",  // no perf events
		0,   // no resctrl
	)
	if err != nil {
		log.Fatalf("manager: %v", err)
	}
	if err := m.Start(); err != nil {
		log.Fatalf("start: %v", err)
	}
	counts := &oomCounts{kills: map[string]uint64{}}
	counts.watch()
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics.NewPrometheusCollector(
		withOOMs{Manager: m, counts: counts},
		kubeletLabels,
		included,
		clock.RealClock{},
		info.RequestOptions{IdType: "name", Count: 1, Recursive: true},
	))
	http.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	fmt.Fprintf(os.Stderr, "cadvisor-peer on %s, roots %v\n", *listen, cgroupRoots)
	log.Fatal(http.ListenAndServe(*listen, nil))
}
