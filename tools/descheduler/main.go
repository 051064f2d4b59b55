// Command descheduler runs the kubernetes-sigs descheduler from its official module, for
// the end-to-end tests of eviction interception: a real descheduler evicting through the
// Eviction API, against the local control plane.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"sigs.k8s.io/descheduler/cmd/descheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewDeschedulerCommand(os.Stdout)))
}
