#!/usr/bin/env bash
# Builds the real node's binaries from the Go module proxy at the versions in versions.env:
# kubelet and kube-proxy (from the same Kubernetes module build.sh uses), containerd and its
# runc shim, CoreDNS, and crictl (to tear the node's pods down through the CRI). runc, the
# CNI plugins, podman/buildah, socat and iptables come from Debian (scripts/node-deps.sh).
#
# Cached like build.sh, in a folder keyed by every version; prints it on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

need=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr coredns crictl)
cache=${VLLM_OP_CACHE:-$HOME/.cache/vllm-operator}
key="node-k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION-coredns-$COREDNS_VERSION-crictl-$CRICTL_VERSION"
out="$cache/bin/$key"
missing=()
for b in "${need[@]}"; do [[ -x "$out/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then echo "$out"; exit 0; fi

# build.sh makes the Kubernetes wrapper module (and its go.sum) that kubelet builds from.
bash "$here/build.sh" >/dev/null

mkdir -p "$out" "$cache/build"
export GOFLAGS=-buildvcs=false CGO_ENABLED=0
ldflags="-s -w"
log() { echo "[build-node $(date +%H:%M:%S)] $*" >&2; }
start=$(date +%s)

build_kubelet() {
  local mod="$cache/build/kubernetes-$K8S_VERSION"
  if [[ ! -f "$mod/.resolved-node" ]]; then
    (cd "$mod" && go get "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-proxy@$K8S_VERSION" >/dev/null && touch .resolved-node)
  fi
  log "building kubelet and kube-proxy $K8S_VERSION"
  (cd "$mod" && go build -trimpath -ldflags "$ldflags -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" -o "$out/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
}

build_module() { # name version tags package...
  local name=$1 version=$2 tags=$3
  shift 3
  local mod="$cache/build/$name-$version"
  mkdir -p "$mod"
  if [[ ! -f "$mod/.resolved" ]]; then
    printf 'module vllm-operator.dev/%s-build\n\ngo 1.26.0\n' "$name" >"$mod/go.mod"
    (cd "$mod" && go get "${@/%/@$version}" >/dev/null && touch .resolved)
  fi
  log "building $name $version"
  (cd "$mod" && go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/" "$@")
}

for b in "${missing[@]}"; do
  case "$b" in
    kubelet|kube-proxy) [[ -x "$out/kubelet" && -x "$out/kube-proxy" ]] || build_kubelet ;;
    containerd|containerd-shim-runc-v2|ctr)
      [[ -x "$out/containerd" && -x "$out/containerd-shim-runc-v2" && -x "$out/ctr" ]] || build_module containerd "$CONTAINERD_VERSION" no_btrfs \
        github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
        github.com/containerd/containerd/v2/cmd/ctr ;;
    coredns) build_module coredns "$COREDNS_VERSION" "" github.com/coredns/coredns ;;
    crictl) build_module crictl "$CRICTL_VERSION" "" sigs.k8s.io/cri-tools/cmd/crictl ;;
  esac
done
log "built in $(( $(date +%s) - start )) s into $out"
echo "$out"
