// Command kcp is a multi-call binary that runs one component of a local
// Kubernetes control plane, chosen by its first argument. One binary keeps
// the build, link and cache cost of the five components to a single artifact.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: kcp etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl [flags]")
	os.Exit(2)
}

func main() {
	name := os.Args[0]
	if filepath.Base(name) == "kubectl" {
		// Invoked through a symlink named kubectl: behave exactly like kubectl.
		runKubectl()
		return
	}
	if len(os.Args) < 2 {
		usage()
	}
	component, args := os.Args[1], os.Args[2:]
	switch component {
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, args...))
		return
	case "kubectl":
		os.Args = append([]string{"kubectl"}, args...)
		runKubectl()
		return
	}
	newCommand, ok := components[component]
	if !ok {
		usage()
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}

func runKubectl() {
	if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err)
	}
}
