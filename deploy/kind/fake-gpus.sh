#!/bin/sh
# Advertise N (default 8) nvidia.com/gpu on every worker node of the current cluster, so
# GPU AppWrappers can be queued and dispatched on a cluster without GPUs (kind). Pods that
# request them are scheduled but use nothing. Undo: the same with N=0.
#
#   deploy/kind/fake-gpus.sh 8
set -eu
gpus="${1:-8}"
for node in $(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
  kubectl patch "$node" --subresource=status --type=json \
    -p "[{\"op\": \"add\", \"path\": \"/status/capacity/nvidia.com~1gpu\", \"value\": \"$gpus\"}]"
done
