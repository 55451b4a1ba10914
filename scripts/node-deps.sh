#!/usr/bin/env bash
# Installs, from Debian's packages, what the real node and the image builds need and no Go
# build provides: podman/buildah (image builds), runc (containerd's runtime), the CNI
# plugins, debootstrap (the base image), socat (pods' path to the apiserver), iptables
# and conntrack (kube-proxy), gcc's static libc (the pause image). Idempotent: installs
# nothing when every command is already there. Needs root (CI and the dev machines are).
set -euo pipefail

declare -A want=(
  [podman]=podman [buildah]=buildah [runc]=runc [debootstrap]=debootstrap
  [socat]=socat [conntrack]=conntrack [iptables]=iptables [ip]=iproute2 [gcc]=gcc
  [/usr/lib/cni/bridge]=containernetworking-plugins [fuse-overlayfs]=fuse-overlayfs
)
missing=()
for cmd in "${!want[@]}"; do
  if [[ "$cmd" == /* ]]; then [[ -x "$cmd" ]] || missing+=("${want[$cmd]}")
  else command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}"); fi
done
if [[ ${#missing[@]} -eq 0 ]]; then exit 0; fi
if [[ $(id -u) -ne 0 ]]; then
  echo "node-deps: need root to install: ${missing[*]}" >&2
  exit 1
fi
echo "[node-deps] installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq "${missing[@]}" >&2
