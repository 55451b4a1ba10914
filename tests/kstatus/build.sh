#!/usr/bin/env bash
# Builds tests/kstatus (a tiny program over sigs.k8s.io/cli-utils' kstatus library) from the
# Go module proxy into the same cache as the control-plane binaries, keyed by the
# cli-utils version and this folder's sources; a second run costs nothing.
# Prints the binary's path on its last line of stdout.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=$(awk '/sigs.k8s.io\/cli-utils/ {print $2; exit}' "$here/go.mod")
sum=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache=${VLLM_OP_CACHE:-$HOME/.cache/vllm-operator}
out="$cache/bin/kstatus-$version-$sum/kstatus"
if [[ ! -x "$out" ]]; then
  mkdir -p "$(dirname "$out")"
  echo "[build] kstatus (cli-utils $version)" >&2
  (cd "$here" && GOFLAGS=-buildvcs=false CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out.tmp" . && mv "$out.tmp" "$out")
fi
echo "$out"
