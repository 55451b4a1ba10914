#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy at pinned versions:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok and helm.
#
# The binaries land in a cache folder outside the checkout, keyed by every version, so a
# second run costs nothing. If VLLM_OP_K8S_BIN names a folder of prebuilt binaries (as
# envtest's KUBEBUILDER_ASSETS does), nothing is built and that folder is used as is.
#
# Prints the folder that holds the binaries on its last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

need=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)

if [[ -n "${VLLM_OP_K8S_BIN:-}" ]]; then
  for b in "${need[@]}"; do
    [[ -x "$VLLM_OP_K8S_BIN/$b" ]] || { echo "VLLM_OP_K8S_BIN=$VLLM_OP_K8S_BIN lacks an executable $b" >&2; exit 1; }
  done
  echo "$VLLM_OP_K8S_BIN"
  exit 0
fi

cache=${VLLM_OP_CACHE:-$HOME/.cache/vllm-operator}
key="k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
out="$cache/bin/$key"
missing=()
for b in "${need[@]}"; do [[ -x "$out/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then echo "$out"; exit 0; fi

mkdir -p "$out" "$cache/build"
export GOFLAGS=-buildvcs=false CGO_ENABLED=0
ldflags="-s -w"
log() { echo "[build $(date +%H:%M:%S)] $*" >&2; }
start=$(date +%s)

# Kubernetes: its go.mod replaces every k8s.io staging module with a local path, which a
# dependent module ignores; so build from a module of our own that pins each staging module
# to its published v0.Y.Z twin.
build_kubernetes() {
  local mod="$cache/build/kubernetes-$K8S_VERSION" minor
  minor="v0.${K8S_VERSION#v1.}"
  mkdir -p "$mod"
  # The stamp, not go.sum, marks a complete module: go.sum exists after a partial `go get`.
  if [[ ! -f "$mod/.resolved" ]]; then
    local upstream
    upstream=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    {
      echo "module vllm-operator.dev/k8s-build"
      echo
      echo "go 1.26.0"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$upstream" \
        | awk -v v="$minor" '{print "replace " $1 " => " $1 " " v}'
    } >"$mod/go.mod"
    # Resolve every command we build, not just one: each pulls its own dependencies
    # (kubelet, cadvisor, cli-runtime, ...) into go.sum.
    (cd "$mod" && go mod download k8s.io/kubernetes && \
      go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" >/dev/null && touch .resolved)
  fi
  log "building kubernetes $K8S_VERSION"
  (cd "$mod" && go build -trimpath -ldflags "$ldflags -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" -o "$out/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl)
}

# etcd's own go.mod also carries replace directives, so the same wrapper trick.
build_etcd() {
  local mod="$cache/build/etcd-$ETCD_VERSION"
  mkdir -p "$mod"
  if [[ ! -f "$mod/go.sum" ]]; then
    printf 'module vllm-operator.dev/etcd-build\n\ngo 1.26.0\n' >"$mod/go.mod"
    (cd "$mod" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null)
  fi
  log "building etcd $ETCD_VERSION"
  (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$out/etcd" go.etcd.io/etcd/server/v3)
}

build_plain() { # name package version
  local mod="$cache/build/$1-$3"
  mkdir -p "$mod"
  if [[ ! -f "$mod/go.sum" ]]; then
    printf 'module vllm-operator.dev/%s-build\n\ngo 1.26.0\n' "$1" >"$mod/go.mod"
    (cd "$mod" && go get "$2@$3" >/dev/null)
  fi
  log "building $1 $3"
  (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$out/$1" "$2")
}

for b in "${missing[@]}"; do
  case "$b" in
    etcd) build_etcd ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl)
      [[ -x "$out/kube-apiserver" && -x "$out/kube-controller-manager" && -x "$out/kube-scheduler" && -x "$out/kubectl" ]] || build_kubernetes ;;
    kwok) build_plain kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" ;;
    helm) build_plain helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" ;;
  esac
done
log "built in $(( $(date +%s) - start )) s into $out"
echo "$out"
