// Command controlplane runs a real, minimal Kubernetes control plane in one
// process for tests: embedded etcd, kube-apiserver and (optionally) the
// garbage-collector, namespace and service-account controllers of
// kube-controller-manager. No kubelet and no scheduler: pods never run,
// unless --node-name is given: then it serves a real node (tests/realnode.sh),
// with what that node's pods need (see nodeMode).
//
// It prints one JSON line on stdout once the API server answers /readyz and
// runs until SIGTERM/SIGINT, then shuts everything down and exits 0.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

// serviceCIDR is only an allocation range for Service objects; nothing is
// ever routed to it.
const serviceCIDR = "10.0.0.0/24"

type options struct {
	stateDir      string
	kubeconfigOut string
	port          int
	controllers   bool
	logFile       string
	verbosity     int
	readyTimeout  time.Duration
	// A real node (both set, or neither): its name and the address its pods
	// reach the API server at.
	nodeName string
	nodeIP   net.IP
	// Further kube-apiserver flags, after the built-in ones (e.g. an alpha
	// API: --feature-gates=... --runtime-config=...).
	apiserverArgs []string
}

// repeated collects each use of a flag.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, " ") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// nodeMode says whether a real node will run against this control plane.
func (o *options) nodeMode() bool { return o.nodeName != "" }

// stderr is the process's original standard error; fd 2 itself is pointed
// at the log file so that klog, etcd and panics land there by default.
var stderr = os.Stderr

func main() {
	var o options
	flag.StringVar(&o.stateDir, "state-dir", "", "directory for certificates, etcd data and logs (default: a new temp dir, removed at exit)")
	flag.StringVar(&o.kubeconfigOut, "kubeconfig-out", "", "where to write the admin kubeconfig (default: <state-dir>/admin.kubeconfig)")
	flag.IntVar(&o.port, "port", 0, "API server secure port on 127.0.0.1 (0: a free port)")
	flag.BoolVar(&o.controllers, "controllers", true, "run the garbage-collector, namespace and service-account controllers")
	flag.StringVar(&o.logFile, "log-file", "", `log file (default: <state-dir>/controlplane.log; "-": stderr)`)
	flag.IntVar(&o.verbosity, "v", 0, "klog verbosity")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 2*time.Minute, "give up if not ready within this time")
	flag.StringVar(&o.nodeName, "node-name", "", "serve a real node of this name: ServiceAccount admission, the controllers pods need, a kubelet kubeconfig (needs --node-ip)")
	nodeIP := flag.String("node-ip", "", "with --node-name: the host address the API server listens on, which pods reach through the kubernetes Service")
	flag.Var((*repeated)(&o.apiserverArgs), "apiserver-arg", "a further kube-apiserver flag, such as --runtime-config=resource.k8s.io/v1alpha3=true (repeatable)")
	flag.Parse()
	if err := o.parseNode(*nodeIP); err != nil {
		fmt.Fprintln(stderr, "controlplane:", err)
		os.Exit(2)
	}

	if err := run(&o); err != nil {
		fmt.Fprintln(stderr, "controlplane:", err)
		printLogTail(o.logFile, 40)
		os.Exit(1)
	}
}

func (o *options) parseNode(ip string) error {
	if (o.nodeName == "") != (ip == "") {
		return errors.New("--node-name and --node-ip go together")
	}
	if ip == "" {
		return nil
	}
	if o.nodeIP = net.ParseIP(ip); o.nodeIP == nil || o.nodeIP.IsLoopback() {
		// Pods cannot reach the host's loopback, and the kubernetes
		// Service's endpoints may not be one.
		return fmt.Errorf("--node-ip %q: not a non-loopback IP address", ip)
	}
	return nil
}

// listenIP is where the API server listens: the loopback, or the node's
// address that its pods can reach.
func (o *options) listenIP() string {
	if o.nodeMode() {
		return o.nodeIP.String()
	}
	return "127.0.0.1"
}

// printLogTail copies the end of the log to the original stderr, so a test
// that failed to start the control plane shows why.
func printLogTail(path string, lines int) {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	fmt.Fprintf(stderr, "controlplane: last lines of %s:\n", path)
	for _, l := range all[max(0, len(all)-lines):] {
		fmt.Fprintln(stderr, "  ", l)
	}
}

func run(o *options) (err error) {
	start := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	tempDir := ""
	if o.stateDir == "" {
		dir, mkErr := os.MkdirTemp("", "controlplane-")
		if mkErr != nil {
			return mkErr
		}
		// Kept after a failure, for its log.
		defer func() {
			if err == nil {
				os.RemoveAll(dir)
			}
		}()
		o.stateDir, tempDir = dir, dir
	}
	if err := os.MkdirAll(o.stateDir, 0o700); err != nil {
		return err
	}
	if o.kubeconfigOut == "" {
		o.kubeconfigOut = filepath.Join(o.stateDir, "admin.kubeconfig")
	}
	if o.logFile == "" {
		o.logFile = filepath.Join(o.stateDir, "controlplane.log")
	}
	if o.logFile != "-" {
		if err := redirectStderr(o.logFile); err != nil {
			return err
		}
	}

	ln, err := net.Listen("tcp", net.JoinHostPort(o.listenIP(), fmt.Sprint(o.port)))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}

	pki, err := writePKI(filepath.Join(o.stateDir, "pki"), o.nodeIP, o.nodeName)
	if err != nil {
		return err
	}

	// etcd: a fresh data dir each start; retried in case another process
	// took the free port between choosing and binding it.
	var etcd *embed.Etcd
	var etcdURL string
	for try := 0; try < 3; try++ {
		if etcd, etcdURL, err = startEtcd(filepath.Join(o.stateDir, "etcd"), o.logFile); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	server := "https://" + ln.Addr().String()
	if err := writeKubeconfig(o.kubeconfigOut, server, pki); err != nil {
		return err
	}
	kubeletKubeconfig := ""
	if o.nodeMode() {
		kubeletKubeconfig = filepath.Join(o.stateDir, "kubelet.kubeconfig")
		if err := writeClientKubeconfig(kubeletKubeconfig, server, pki, "system:node:"+o.nodeName, pki.kubeletCertPEM, pki.kubeletKeyPEM); err != nil {
			return err
		}
	}

	apiCtx, apiCancel := context.WithCancel(context.Background())
	defer apiCancel()
	apiDone := make(chan error, 1)
	go func() { apiDone <- runAPIServer(apiCtx, o, ln, etcdURL, pki) }()

	kcmCtx, kcmCancel := context.WithCancel(context.Background())
	defer kcmCancel()
	var kcmDone chan error // nil (never ready to receive) until the controllers start

	// stopAll shuts down in reverse order: controllers, API server; etcd is
	// closed by its defer.
	stopAll := func() {
		kcmCancel()
		if kcmDone != nil {
			waitOrTimeout(kcmDone, 15*time.Second)
		}
		apiCancel()
		waitOrTimeout(apiDone, 30*time.Second)
	}

	client, err := newClient(o.kubeconfigOut)
	if err != nil {
		return err
	}
	readyCtx, readyCancel := context.WithTimeout(ctx, o.readyTimeout)
	defer readyCancel()
	if err := waitReady(readyCtx, client, apiDone); err != nil {
		if ctx.Err() != nil {
			exitBeforeReady(tempDir)
		}
		return fmt.Errorf("kube-apiserver not ready: %w (log: %s)", err, o.logFile)
	}
	apiReady := time.Since(start)

	if o.controllers {
		kcmDone = make(chan error, 1)
		go func() { kcmDone <- runControllers(kcmCtx, o, pki) }()
		// The service-account controller creating "default" in "default"
		// shows the controllers are running.
		if err := waitDefaultServiceAccount(readyCtx, client, kcmDone); err != nil {
			if ctx.Err() != nil {
				exitBeforeReady(tempDir)
			}
			return fmt.Errorf("controllers not running: %w (log: %s)", err, o.logFile)
		}
	}

	line, _ := json.Marshal(map[string]any{
		"kubeconfig":  o.kubeconfigOut,
		"server":      server,
		"ca":          pki.caFile,
		"etcd":        etcdURL,
		"state_dir":   o.stateDir,
		"log":         o.logFile,
		"controllers": o.controllers,
		"node":        o.nodeName,
		// with a node: the kubelet's kubeconfig (system:node:<node>)
		"kubelet_kubeconfig": kubeletKubeconfig,
		"ready_seconds":      time.Since(start).Round(time.Millisecond).Seconds(),
		// API server answering /readyz, before the controllers' wait
		"apiserver_ready_seconds": apiReady.Round(time.Millisecond).Seconds(),
	})
	fmt.Println(string(line))

	select {
	case <-ctx.Done():
	case err := <-apiDone:
		return fmt.Errorf("kube-apiserver stopped: %v", err)
	case err := <-kcmDone:
		return fmt.Errorf("controllers stopped: %v", err)
	}
	stopAll()
	return nil
}

// exitBeforeReady ends the process at once on SIGTERM/SIGINT before it was
// ready: cancelling kube-apiserver while its post-start hooks still run makes
// it exit 255 (klog.Fatal), and nothing has used it yet, so there is nothing
// to shut down gracefully.
func exitBeforeReady(tempDir string) {
	if tempDir != "" {
		os.RemoveAll(tempDir)
	}
	os.Exit(0)
}

func waitOrTimeout(done <-chan error, d time.Duration) {
	select {
	case <-done:
	case <-time.After(d):
		fmt.Fprintln(stderr, "controlplane: shutdown timed out after", d)
	}
}

// redirectStderr points fd 2 at the log file, keeping the original standard
// error for this program's own messages.
func redirectStderr(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	orig, err := unix.Dup(2)
	if err != nil {
		return err
	}
	stderr = os.NewFile(uintptr(orig), "stderr")
	return unix.Dup2(int(f.Fd()), 2)
}

func startEtcd(dir, logFile string) (*embed.Etcd, string, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, "", err
	}
	// etcd dials its own client URL, so it needs a real port, not :0.
	// The peer URL is never dialled in a one-member cluster.
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	client, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", port))
	peer, _ := url.Parse("http://127.0.0.1:0")
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true // test data only: trade durability for speed
	cfg.LogLevel = "error"
	if logFile == "-" {
		cfg.LogOutputs = []string{"stderr"}
	} else {
		cfg.LogOutputs = []string{logFile}
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", errors.New("etcd not ready after 60s")
	}
	return e, "http://" + e.Clients[0].Addr().String(), nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// parseFlags parses command-line style args into a component's flag sets.
func parseFlags(sets cliflag.NamedFlagSets, args []string) error {
	fs := pflag.NewFlagSet("component", pflag.ContinueOnError)
	for _, name := range sets.Order {
		fs.AddFlagSet(sets.FlagSets[name])
	}
	return fs.Parse(args)
}

func runAPIServer(ctx context.Context, o *options, ln net.Listener, etcdURL string, pki *pkiFiles) error {
	s := apiserveroptions.NewServerRunOptions()
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + o.listenIP(),
		"--advertise-address=" + o.listenIP(),
		fmt.Sprintf("--secure-port=%d", ln.Addr().(*net.TCPAddr).Port),
		"--tls-cert-file=" + pki.servingCert,
		"--tls-private-key-file=" + pki.servingKey,
		"--client-ca-file=" + pki.caFile,
		"--service-account-key-file=" + pki.saPub,
		"--service-account-signing-key-file=" + pki.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=" + serviceCIDR,
		// As real clusters: the node agent's DaemonSet is privileged.
		"--allow-privileged=true",
		"--profiling=false",
	}
	args = append(args, admissionArgs(o)...)
	args = append(args, o.apiserverArgs...)
	if err := parseFlags(s.Flags(), args); err != nil {
		return err
	}
	s.SecureServing.Listener = ln
	s.Logs.Verbosity = logsapi.VerbosityLevel(o.verbosity)
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(s.Logs, nil); err != nil {
		return err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return errors.Join(errs...)
	}
	return apiserver.Run(ctx, completed)
}

// admissionArgs: without a node, pods are only stored, so they need no
// ServiceAccount object and the kubernetes Service no endpoints (127.0.0.1,
// which Endpoints validation rejects). With a node, pods run as on a real
// cluster: ServiceAccount admission mounts bound tokens (carrying the node's
// name), NodeRestriction holds the kubelet to its own node, and the kubernetes
// Service points at the node address.
func admissionArgs(o *options) []string {
	if !o.nodeMode() {
		return []string{
			"--disable-admission-plugins=ServiceAccount",
			"--endpoint-reconciler-type=none",
		}
	}
	return []string{
		"--enable-admission-plugins=NodeRestriction",
		"--endpoint-reconciler-type=lease",
	}
}

// controllerList: the GC, namespace and service-account controllers; with a
// node also what makes its workloads run: Deployments, ReplicaSets,
// DaemonSets, EndpointSlices of Services, the node lifecycle (it lifts the
// not-ready taint the kubelet registers with), pod GC, and the root CA
// publisher (kube-root-ca.crt, which every service-account token volume mounts).
func controllerList(o *options) string {
	list := "garbagecollector,namespace,serviceaccount-token,serviceaccount"
	if o.nodeMode() {
		list += ",deployment,replicaset,daemonset,endpointslice,nodelifecycle,podgc,root-ca-cert-publisher"
	}
	return list
}

func runControllers(ctx context.Context, o *options, pki *pkiFiles) error {
	s, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + o.kubeconfigOut,
		"--controllers=" + controllerList(o),
		"--use-service-account-credentials=false",
		"--leader-elect=false",
		"--secure-port=0",
		"--service-account-private-key-file=" + pki.saKey,
		"--root-ca-file=" + pki.caFile,
	}
	sets := s.Flags(kcm.KnownControllers(), kcm.ControllersDisabledByDefault(), kcm.ControllerAliases())
	s.ParsedFlags = &sets
	if err := parseFlags(sets, args); err != nil {
		return err
	}
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	c, err := controllerManagerConfig(ctx, s)
	if err != nil {
		return err
	}
	return kcm.Run(ctx, c)
}

func newClient(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// poll calls check every 100ms until it returns true, ctx ends or a component
// reports an error on died.
func poll(ctx context.Context, died <-chan error, check func() (bool, error)) error {
	var last error
	for {
		ok, err := check()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case err := <-died:
			return fmt.Errorf("stopped: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func waitReady(ctx context.Context, c *kubernetes.Clientset, died <-chan error) error {
	return poll(ctx, died, func() (bool, error) {
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok", err
	})
}

func waitDefaultServiceAccount(ctx context.Context, c *kubernetes.Clientset, died <-chan error) error {
	return poll(ctx, died, func() (bool, error) {
		_, err := c.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}
