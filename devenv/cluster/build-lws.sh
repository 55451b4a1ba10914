#!/usr/bin/env bash
# Builds the LeaderWorkerSet controller (sigs.k8s.io/lws) from the Go module proxy at the
# pinned LWS_VERSION (versions.env), for the multi-node e2e tests (docs/multi-node.md).
#
# Like build.sh: the binary lands in a cache folder outside the checkout, keyed by the
# version, so a second run costs nothing; the module's CRDs and webhook manifests are copied
# beside it (the controller installs neither itself). Both CRDs: the controller of v0.9.0
# also runs a DisaggregatedSet controller, which fails the start without its kind.
# VLLM_OP_LWS_BIN names a folder with a prebuilt `lws-controller` (and `crds/`,
# `webhooks.yaml`) to use instead.
#
# Prints the folder on its last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

if [[ -n "${VLLM_OP_LWS_BIN:-}" ]]; then
  [[ -x "$VLLM_OP_LWS_BIN/lws-controller" ]] || { echo "VLLM_OP_LWS_BIN=$VLLM_OP_LWS_BIN lacks an executable lws-controller" >&2; exit 1; }
  echo "$VLLM_OP_LWS_BIN"
  exit 0
fi

cache=${VLLM_OP_CACHE:-$HOME/.cache/vllm-operator}
out="$cache/bin/lws-$LWS_VERSION"
if [[ -x "$out/lws-controller" && -f "$out/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml" \
      && -f "$out/crds/disaggregatedset.x-k8s.io_disaggregatedsets.yaml" && -f "$out/webhooks.yaml" ]]; then
  echo "$out"; exit 0
fi

log() { echo "[build $(date +%H:%M:%S)] $*" >&2; }
start=$(date +%s)
mkdir -p "$out/crds" "$cache/build"
export GOFLAGS=-buildvcs=false CGO_ENABLED=0
# LWS's go.mod has no replace directives, so `go install`'s module mode would do; a
# wrapper module (as build.sh's build_plain) keeps go.sum in the cache for offline reruns.
mod="$cache/build/lws-$LWS_VERSION"
mkdir -p "$mod"
if [[ ! -f "$mod/.resolved" ]]; then
  printf 'module vllm-operator.dev/lws-build\n\ngo 1.26.0\n' >"$mod/go.mod"
  (cd "$mod" && go get "sigs.k8s.io/lws/cmd@$LWS_VERSION" >/dev/null 2>&1 || go get "sigs.k8s.io/lws@$LWS_VERSION" >/dev/null) && touch "$mod/.resolved"
fi
log "building lws $LWS_VERSION"
(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$out/lws-controller" sigs.k8s.io/lws/cmd)
src=$(cd "$mod" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)
cp "$src"/config/crd/bases/*.yaml "$out/crds/"
cp "$src"/config/webhook/manifests.yaml "$out/webhooks.yaml"
chmod -R u+w "$out/crds"
log "built lws in $(( $(date +%s) - start )) s into $out"
echo "$out"
