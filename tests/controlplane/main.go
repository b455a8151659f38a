// controlplane starts a real Kubernetes control plane in ONE process for
// gpu-remediate's fidelity tests: an embedded etcd, kube-apiserver, the
// kube-controller-manager controllers the product depends on, and
// kube-scheduler. There is no kubelet: tests/controlplane/node_agent.py plays
// the kubelets of the simulated GPU nodes.
//
//	controlplane --data-dir DIR [--port N] [--kubeconfig FILE]
//
// When the API server answers /readyz and the controllers and scheduler have
// been started it prints one line `READY {json}` on stdout with the kubeconfig
// path, the server URL and the admin token. SIGTERM/SIGINT stop everything.
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	basecompatibility "k8s.io/component-base/compatibility"
	logsapi "k8s.io/component-base/logs/api/v1"

	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	schedoptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

// Controllers started by default: what gpu-remediate touches (PDB status for
// evictions, Jobs, ReplicaSets/Deployments, owner-reference garbage
// collection) plus what keeps a cluster honest without kubelets (node
// lifecycle, pod GC, taint eviction) and what every namespace needs.
const defaultControllers = "disruption-controller,job-controller,replicaset-controller,deployment-controller," +
	"daemonset-controller,statefulset-controller,garbage-collector-controller,namespace-controller," +
	"serviceaccount-controller,serviceaccount-token-controller,node-lifecycle-controller," +
	"pod-garbage-collector-controller,taint-eviction-controller,ttl-after-finished-controller," +
	"root-ca-certificate-publisher-controller"

func main() {
	var (
		dataDir     = flag.String("data-dir", "", "directory for etcd data, certificates and the kubeconfig (required)")
		port        = flag.Int("port", 0, "kube-apiserver secure port on 127.0.0.1 (0: a free port)")
		kubeconfig  = flag.String("kubeconfig", "", "where to write the admin kubeconfig (default DATA_DIR/kubeconfig)")
		controllers = flag.String("controllers", defaultControllers, "kube-controller-manager --controllers")
		noSched     = flag.Bool("no-scheduler", false, "do not start kube-scheduler")
		verbosity   = flag.Int("v", 0, "klog verbosity of all components")
		version     = flag.Bool("version", false, "print the Kubernetes version and exit")
		extra       stringList
	)
	flag.Var(&extra, "apiserver-arg", "an extra kube-apiserver flag, e.g. --apiserver-arg=--audit-log-path=/tmp/audit.log (repeatable)")
	flag.Parse()
	if *version {
		fmt.Println(kubeVersion())
		return
	}
	if *dataDir == "" {
		fatal(fmt.Errorf("--data-dir is required"))
	}
	if *kubeconfig == "" {
		*kubeconfig = filepath.Join(*dataDir, "kubeconfig")
	}
	if err := run(*dataDir, *port, *kubeconfig, *controllers, !*noSched, *verbosity, extra); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
	os.Exit(1)
}

func step(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "controlplane: "+format+"\n", args...)
}

func run(dataDir string, port int, kubeconfigPath, controllers string, withScheduler bool, verbosity int, extra []string) error {
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigs
		step("%v: stopping", s)
		cancel()
		select {
		case <-sigs:
		case <-time.After(5 * time.Second):
		}
		os.Exit(0)
	}()

	pki := filepath.Join(dataDir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return err
	}

	// Credentials: a static admin token (system:masters) for the tests and
	// the components, and a service-account signing key for TokenRequest.
	token := randomHex(16)
	tokenFile := filepath.Join(pki, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return err
	}
	saKey := filepath.Join(pki, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return err
	}

	// 1. etcd, embedded.
	etcdURL, err := startEtcd(ctx, filepath.Join(dataDir, "etcd"))
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	step("etcd ready at %s (%.1fs)", etcdURL, time.Since(start).Seconds())

	// 2. kube-apiserver.
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("apiserver listen: %w", err)
	}
	port = ln.Addr().(*net.TCPAddr).Port
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	s := apiserveroptions.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--cert-dir=" + pki,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		"--profiling=false",
		"--endpoint-reconciler-type=none",
		fmt.Sprintf("--v=%d", verbosity),
	}, extra...)); err != nil {
		return fmt.Errorf("apiserver flags: %w", err)
	}
	s.SecureServing.Listener = ln
	s.SecureServing.BindPort = port
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	featureGate := s.GenericServerRunOptions.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)
	if err := logsapi.ValidateAndApply(s.Logs, featureGate); err != nil {
		return err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return fmt.Errorf("apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return fmt.Errorf("apiserver options: %v", errs)
	}
	apiErr := make(chan error, 1)
	go func() { apiErr <- apiserverapp.Run(ctx, completed) }()

	// kubeconfig for the tests and for the components.
	caData, err := os.ReadFile(filepath.Join(pki, "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("apiserver certificate: %w", err)
	}
	if err := writeKubeconfig(kubeconfigPath, server, caData, token); err != nil {
		return err
	}
	if err := waitReady(ctx, server+"/readyz", caData, token, apiErr); err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	step("kube-apiserver ready at %s (%.1fs)", server, time.Since(start).Seconds())

	// 3. kube-controller-manager, in this process.
	kcm, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return err
	}
	kfs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, f := range kcm.Flags(kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases()).FlagSets {
		kfs.AddFlagSet(f)
	}
	if err := kfs.Parse([]string{
		"--kubeconfig=" + kubeconfigPath,
		"--controllers=" + controllers,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file=" + saKey,
		"--root-ca-file=" + filepath.Join(pki, "apiserver.crt"),
		// Fast enough for tests, still the real code paths.
		"--node-monitor-grace-period=40s",
		"--concurrent-gc-syncs=5",
	}); err != nil {
		return fmt.Errorf("controller-manager flags: %w", err)
	}
	kcmConfig, err := controllerManagerConfig(ctx, kcm)
	if err != nil {
		return fmt.Errorf("controller-manager config: %w", err)
	}
	kcmErr := make(chan error, 1)
	go func() { kcmErr <- kcmapp.Run(ctx, kcmConfig.Complete()) }()
	step("kube-controller-manager started: %s (%.1fs)", controllers, time.Since(start).Seconds())

	// 4. kube-scheduler, in this process.
	schedErr := make(chan error, 1)
	if withScheduler {
		so := schedoptions.NewOptions()
		sfs := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
		for _, f := range so.Flags.FlagSets {
			sfs.AddFlagSet(f)
		}
		if err := sfs.Parse([]string{
			"--kubeconfig=" + kubeconfigPath,
			"--leader-elect=false",
			"--secure-port=0",
		}); err != nil {
			return fmt.Errorf("scheduler flags: %w", err)
		}
		cc, sched, err := schedapp.Setup(ctx, so)
		if err != nil {
			return fmt.Errorf("scheduler: %w", err)
		}
		go func() { schedErr <- schedapp.Run(ctx, cc, sched) }()
		step("kube-scheduler started (%.1fs)", time.Since(start).Seconds())
	}

	ready, _ := json.Marshal(map[string]any{
		"kubeconfig": kubeconfigPath, "server": server, "token": token,
		"version": kubeVersion(), "controllers": strings.Split(controllers, ","),
		"scheduler": withScheduler, "seconds": time.Since(start).Seconds(),
	})
	fmt.Printf("READY %s\n", ready)
	os.Stdout.Sync()

	select {
	case err := <-apiErr:
		return fmt.Errorf("kube-apiserver stopped: %v", err)
	case err := <-kcmErr:
		return fmt.Errorf("kube-controller-manager stopped: %v", err)
	case err := <-schedErr:
		return fmt.Errorf("kube-scheduler stopped: %v", err)
	case <-ctx.Done():
		time.Sleep(time.Second)
		return nil
	}
}

func kubeVersion() string {
	// Set through -ldflags by build.sh; the module version otherwise.
	if buildKubeVersion != "" {
		return buildKubeVersion
	}
	return "unknown"
}

var buildKubeVersion = ""

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startEtcd(ctx context.Context, dir string) (string, error) {
	clientPort, err := freePort()
	if err != nil {
		return "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "controlplane"
	cfg.Dir = dir
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ListenMetricsUrls = nil
	// Tests do not need durability across power loss.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return "", err
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		return "", fmt.Errorf("not ready after 60s")
	}
	go func() { <-ctx.Done(); e.Close() }()
	return cu.String(), nil
}

func writeKubeconfig(path, server string, caData []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["controlplane"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caData}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["controlplane"] = &clientcmdapi.Context{Cluster: "controlplane", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "controlplane"
	return clientcmd.WriteToFile(*cfg, path)
}

func waitReady(ctx context.Context, readyz string, caData []byte, token string, failed <-chan error) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caData)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(120 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		select {
		case err := <-failed:
			return fmt.Errorf("stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		req, _ := http.NewRequest("GET", readyz, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("/readyz not ok after 120s: %s", last)
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
