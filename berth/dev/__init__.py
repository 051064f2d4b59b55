"""The local control plane: real etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, built from the official Go modules, for tests and the demo."""
