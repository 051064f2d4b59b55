#!/usr/bin/env bash
# After the demo: where the cluster is and how to explore it.
set -euo pipefail
berth=.venv/bin/berth
echo
echo "The local cluster keeps running. Explore it from your shell:"
echo "  $($berth dev env)"
echo "  kubectl get pmj                 # the migrations: PHASE STATUS NODE RESERVATION POD NEWPOD"
echo "  kubectl describe pmj <name>     # conditions and the events of each step"
echo "  kubectl get reservations        # where capacity was held"
echo "  kubectl migrate pod <pod> --to <node> --wait   # (with .venv/bin on PATH)"
echo "  .venv/bin/berth dev status      # the control plane and Berth's components"
echo "Stop it with: .venv/bin/berth dev down"
