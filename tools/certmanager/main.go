// Command certmanager runs cert-manager's certificate controllers and its CA injector
// in one process, for the local control plane of tests and the demo.
//
// cert-manager's own commands live in Go modules of their own that the module proxy
// does not serve, so this wires the same parts from the root module: the controllers
// registered in controller.Known(), built from one controller context factory, and the
// CA injector's reconcilers on a controller-runtime manager. Only what Berth's objects
// need runs: Issuers (self-signed and CA), the CertificateRequest approver and signers,
// the certificates-* controllers, and injection into webhook configurations. There is
// no leader election: one replica runs beside one local cluster.
//
// Usage: certmanager --kubeconfig FILE [--namespace NS] [--health-port PORT]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// Each of these registers itself in controller.Known() or the issuer factory.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// controllers are the names, in controller.Known(), of the controllers that run.
var controllers = []string{
	"issuers",
	"certificaterequests-approver",
	"certificaterequests-issuer-ca",
	"certificaterequests-issuer-selfsigned",
	"certificates-trigger",
	"certificates-key-manager",
	"certificates-request-manager",
	"certificates-issuing",
	"certificates-readiness",
	"certificates-revision-manager",
}

// workers per controller: a handful of Certificates, so few are enough.
const workers = 2

func main() {
	// A flag set of its own: controller-runtime defines --kubeconfig on the global one.
	flags := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the cluster (required)")
	namespace := flags.String("namespace", "", "watch only this namespace (default: all)")
	healthPort := flags.Int("health-port", 0, "serve /healthz on 127.0.0.1:PORT (0: none)")
	klog.InitFlags(flags)
	_ = flags.Parse(os.Args[1:])
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "certmanager: --kubeconfig is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *kubeconfig, *namespace, *healthPort); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "certmanager: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, namespace string, healthPort int) error {
	logger := klog.Background()
	ctx = logf.NewContext(ctx, logger)
	ctrl.SetLogger(logger)

	group, ctx := errgroup.WithContext(ctx)
	if err := startControllers(ctx, group, kubeconfig, namespace); err != nil {
		return err
	}
	if err := startInjector(ctx, group, kubeconfig, namespace); err != nil {
		return err
	}
	if healthPort != 0 {
		if err := serveHealth(ctx, group, healthPort); err != nil {
			return err
		}
	}
	return group.Wait()
}

// startControllers builds each controller from one context factory, as cert-manager's
// controller command does, then starts the shared informers they registered with.
func startControllers(ctx context.Context, group *errgroup.Group, kubeconfig, namespace string) error {
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		Namespace:          namespace,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: "cert-manager"},
		CertificateOptions: controller.CertificateOptions{
			// cert-manager's defaults.
			CopiedAnnotationPrefixes:                 []string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"},
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return fmt.Errorf("controller context: %w", err)
	}
	known := controller.Known()
	for _, name := range controllers {
		constructor, ok := known[name]
		if !ok {
			return fmt.Errorf("controller %q is not registered (have %v)", name, names(known))
		}
		iface, err := constructor(factory)
		if err != nil {
			return fmt.Errorf("controller %q: %w", name, err)
		}
		group.Go(func() error { return iface.Run(workers, ctx) })
	}
	// The controllers' informers exist once every constructor has run; all Contexts
	// built by the factory share these informer factories.
	shared, err := factory.Build()
	if err != nil {
		return fmt.Errorf("controller context: %w", err)
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	return nil
}

// startInjector runs the CA injector's reconcilers for webhook configurations on a
// controller-runtime manager, reading CAs from Certificates and Secrets.
func startInjector(ctx context.Context, group *errgroup.Group, kubeconfig, namespace string) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	config.UserAgent = "cert-manager-cainjector"
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmapi.AddToScheme(scheme))
	utilruntime.Must(admissionv1.AddToScheme(scheme))
	manager, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		// The injector watches only the metadata of Secrets and reads a Secret's data
		// when it needs it, as cert-manager's own injector does.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return fmt.Errorf("CA injector manager: %w", err)
	}
	err = cainjector.RegisterAllInjectors(ctx, manager, cainjector.SetupOptions{
		Namespace:                    namespace,
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
		},
	})
	if err != nil {
		return fmt.Errorf("CA injector: %w", err)
	}
	group.Go(func() error { return manager.Start(ctx) })
	return nil
}

// serveHealth answers /healthz, so that whoever started this process can tell it runs.
func serveHealth(ctx context.Context, group *errgroup.Group, port int) error {
	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("health port: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	group.Go(func() error {
		<-ctx.Done()
		return server.Close()
	})
	group.Go(func() error {
		if err := server.Serve(listener); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	return nil
}

func names(known map[string]controller.Constructor) []string {
	out := make([]string, 0, len(known))
	for name := range known {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}
