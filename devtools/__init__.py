"""The local control plane: real etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, built from the official Go modules, for tests and the demo.

It needs a checkout (the Go modules under `tools/`), so it lives beside the installed
packages rather than in them and never ships in the image; `berth dev` finds it through
the `berth.commands` entry point group.
"""
