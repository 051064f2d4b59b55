#!/usr/bin/env bash
# Show the freshly started local cluster and how to use it.
set -euo pipefail
berth=.venv/bin/berth
eval "$($berth dev env)"
echo
echo "== nodes (kwok fakes, scheduled onto by the real kube-scheduler) =="
kubectl get nodes -o wide
echo
echo "== control plane =="
$berth dev status
echo
echo "Use it from your shell:"
echo "  $($berth dev env)"
echo "  kubectl create deployment web --image=registry.k8s.io/pause:3.10 --replicas=3"
echo "  kubectl get pods -o wide"
echo "Stop it with: .venv/bin/berth dev down"
