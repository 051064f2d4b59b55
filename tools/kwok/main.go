// Command kwok runs sigs.k8s.io/kwok's controller for fake nodes and pods.
//
// `kwok stages` prints kwok's own default stages (node initialisation, heartbeat with
// leases, pod ready/complete/delete) so that the caller can hand them back through
// --config: the kwok binary itself refuses to start without stages.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	heartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/kwok/cmd"
	"sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "stages" {
		stages := []string{
			nodefast.DefaultNodeInit,
			heartbeat.DefaultNodeHeartbeatWithLease,
			podfast.DefaultPodReady,
			podfast.DefaultPodComplete,
			podfast.DefaultPodDelete,
		}
		fmt.Print(strings.Join(stages, "\n---\n"))
		return
	}

	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}

	ctx := signals.SetupSignalContext()
	ctx, logger := log.InitFlags(ctx, flagset)
	ctx, err := config.InitFlags(ctx, flagset)
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flagset.FlagUsages()))
		logger.Error("Init config flags", "err", err)
		os.Exit(1)
	}

	command := cmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flagset)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		os.Exit(1)
	}
}
