package main

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hotproxy/hotproxy/config"
)

// k8sObject is the part of a Kubernetes object the manifest test reads.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec k8sPodSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
		RunAsUser    *int  `yaml:"runAsUser"`
	} `yaml:"securityContext"`
	Containers []k8sContainer `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type k8sContainer struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *struct {
		HTTPGet *struct {
			Path string    `yaml:"path"`
			Port yaml.Node `yaml:"port"`
		} `yaml:"httpGet"`
	} `yaml:"readinessProbe"`
	LivenessProbe *struct {
		Exec *struct {
			Command []string `yaml:"command"`
		} `yaml:"exec"`
	} `yaml:"livenessProbe"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

// TestKubernetesManifest parses examples/kubernetes.yaml (every document,
// unknown fields refused where this test reads) and checks what makes it
// work with the image: the ConfigMap's config validates as serve would
// build it; the Deployment mounts that ConfigMap as a directory at
// /etc/hotproxy (a subPath mount is never updated, and the reload would
// never come) and runs the supervisor with --watch-config; readiness is
// GET /ready on the admin port, which the config binds off loopback (with
// allow_remote); liveness is the image's HEALTHCHECK command; the
// listener's port is a container port; terminationGracePeriodSeconds
// covers parent_shutdown_time + 5 s (the supervisor's bound on a stop)
// without being far longer; the pod runs as the image's non-root uid; the
// selector matches the template.
func TestKubernetesManifest(t *testing.T) {
	const path = "../../examples/kubernetes.yaml"
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	byKind := map[string]*k8sObject{}
	for {
		var o k8sObject
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Fatalf("%s: a document without apiVersion, kind or metadata.name: %+v", path, o)
		}
		byKind[o.Kind] = &o
	}
	cm, dep := byKind["ConfigMap"], byKind["Deployment"]
	if cm == nil || dep == nil || byKind["Service"] == nil {
		t.Fatalf("%s: want a ConfigMap, a Deployment and a Service; have %v", path, slices.Sorted(maps.Keys(byKind)))
	}
	if dep.APIVersion != "apps/v1" {
		t.Errorf("Deployment apiVersion %q, want apps/v1", dep.APIVersion)
	}

	toml, ok := cm.Data["hotproxy.toml"]
	if !ok {
		t.Fatal("the ConfigMap has no key hotproxy.toml (the file the image's entrypoint reads)")
	}
	cfgPath := filepath.Join(t.TempDir(), "hotproxy.toml")
	if err := os.WriteFile(cfgPath, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"validate", "-c", cfgPath}, &stdout, &stderr); code != 0 {
		t.Fatalf("the ConfigMap's hotproxy.toml does not validate: %s", stderr.String())
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}

	pod := dep.Spec.Template.Spec
	for k, v := range dep.Spec.Selector.MatchLabels {
		if dep.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("the Deployment's selector %s=%s does not match its template's labels %v", k, v, dep.Spec.Template.Metadata.Labels)
		}
	}
	if len(dep.Spec.Selector.MatchLabels) == 0 {
		t.Error("the Deployment has no selector")
	}
	wantGrace := cfg.Server.ParentShutdownTime.D() + 5*time.Second
	switch g := pod.TerminationGracePeriodSeconds; {
	case g == nil:
		t.Errorf("no terminationGracePeriodSeconds: Kubernetes' default 30s cuts a drain of parent_shutdown_time %v + 5s short", cfg.Server.ParentShutdownTime.D())
	case time.Duration(*g)*time.Second < wantGrace || time.Duration(*g)*time.Second > wantGrace+30*time.Second:
		t.Errorf("terminationGracePeriodSeconds %d, want parent_shutdown_time + 5s = %v, with at most 30s of margin", *g, wantGrace)
	}
	if sc := pod.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != imageUID(t) {
		t.Errorf("the pod's securityContext: want runAsNonRoot and runAsUser %d (the image's USER)", imageUID(t))
	}

	i := slices.IndexFunc(pod.Containers, func(c k8sContainer) bool { return c.Name == "hotproxy" })
	if i < 0 {
		t.Fatal("the Deployment has no container named hotproxy")
	}
	c := pod.Containers[i]
	if !slices.Contains(c.Args, "--watch-config") {
		t.Errorf("container args %q: without --watch-config a ConfigMap change is never reloaded", c.Args)
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
		ports[strconv.Itoa(p.ContainerPort)] = p.ContainerPort
	}
	for _, l := range cfg.Listeners {
		if _, port, _ := net.SplitHostPort(l.Address); ports[port] == 0 {
			t.Errorf("listener %q on %s: its port is not a containerPort", l.Name, l.Address)
		}
	}

	// Readiness: GET /ready on the admin API, reachable from the kubelet.
	adminHost, adminPort, err := net.SplitHostPort(cfg.Admin.Address)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(adminHost); adminHost != "" && (ip == nil || !ip.IsUnspecified()) || !cfg.Admin.AllowRemote {
		t.Errorf("[admin] address %q, allow_remote %v: the kubelet probes the pod's address, not its loopback", cfg.Admin.Address, cfg.Admin.AllowRemote)
	}
	switch rp := c.ReadinessProbe; {
	case rp == nil || rp.HTTPGet == nil:
		t.Error("no readinessProbe.httpGet")
	case rp.HTTPGet.Path != "/ready":
		t.Errorf("readinessProbe path %q, want /ready", rp.HTTPGet.Path)
	default:
		want, _ := strconv.Atoi(adminPort)
		if got := ports[rp.HTTPGet.Port.Value]; got != want {
			t.Errorf("readinessProbe port %q is container port %d, want the admin API's %d", rp.HTTPGet.Port.Value, got, want)
		}
	}

	// Liveness: the image's HEALTHCHECK, word for word.
	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^HEALTHCHECK .*CMD (\[.*\])$`).FindSubmatch(df)
	if m == nil {
		t.Fatal("no HEALTHCHECK CMD [...] in the Dockerfile")
	}
	var healthcheck []string
	if err := yaml.Unmarshal(m[1], &healthcheck); err != nil {
		t.Fatalf("the Dockerfile's HEALTHCHECK %s: %v", m[1], err)
	}
	if lp := c.LivenessProbe; lp == nil || lp.Exec == nil || !slices.Equal(lp.Exec.Command, healthcheck) {
		t.Errorf("livenessProbe %+v, want exec %q (the Dockerfile's HEALTHCHECK)", lp, healthcheck)
	}

	// The ConfigMap, as a directory at /etc/hotproxy.
	var cmVolume string
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name {
			cmVolume = v.Name
		}
	}
	if cmVolume == "" {
		t.Fatalf("no volume of the ConfigMap %q", cm.Metadata.Name)
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		if vm.Name != cmVolume {
			continue
		}
		mounted = true
		if strings.TrimSuffix(vm.MountPath, "/") != "/etc/hotproxy" {
			t.Errorf("the ConfigMap is mounted at %s, want /etc/hotproxy (the image reads /etc/hotproxy/hotproxy.toml)", vm.MountPath)
		}
		if vm.SubPath != "" {
			t.Errorf("the ConfigMap is mounted with subPath %q: the kubelet never updates a subPath mount, so no change would be reloaded", vm.SubPath)
		}
	}
	if !mounted {
		t.Error("the hotproxy container does not mount the ConfigMap")
	}
}

// imageUID is the uid the Dockerfile's USER names.
func imageUID(t *testing.T) int {
	t.Helper()
	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER (\d+)`).FindSubmatch(df)
	if m == nil {
		t.Fatal("the Dockerfile has no numeric USER")
	}
	uid, _ := strconv.Atoi(string(m[1]))
	return uid
}
