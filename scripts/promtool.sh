#!/usr/bin/env bash
# Prometheus' promtool, for the chart's alert rules (tests/test_chart.py: `promtool check
# rules` parses every expression, `promtool test rules` fires each rule). Taken from
# Debian's prometheus package without installing it (no service is set up or started):
# the package is downloaded and promtool alone extracted into the cache, keyed by the
# package's version. Prints promtool's path. Idempotent.
set -euo pipefail

cache="${VLLM_OP_CACHE:-$HOME/.cache/vllm-operator}/bin"
version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
if [[ -z "$version" || "$version" == "(none)" ]]; then
  apt-get update -qq >&2
  version=$(apt-cache policy prometheus | awk '/Candidate:/ {print $2}')
fi
dir="$cache/promtool-${version//[^A-Za-z0-9.+-]/_}"
if [[ ! -x "$dir/promtool" ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get download -qq "prometheus=$version" >&2)
  dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
  mkdir -p "$dir"
  install -m 0755 "$work/x/usr/bin/promtool" "$dir/promtool"
fi
"$dir/promtool" --version >/dev/null
echo "$dir/promtool"
