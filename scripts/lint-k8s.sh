#!/usr/bin/env bash
# The chart and the Grafana dashboard through four outside linters, printing what each one
# reports: kube-linter and Polaris on the rendered manifests, chart-testing's `ct lint`
# (helm lint, yamllint, yamale) on the chart, Grafana's dashboard-linter on the dashboard.
# docs/linters.md lists every finding that stays and why; `make lint-k8s` runs this.
#
# The chart is rendered three times: default values; every optional part on (ServiceMonitor,
# PodMonitor, PrometheusRule, dashboard and kube-state-metrics ConfigMaps, the GPU node
# agent in report mode); and the same with the agent's power management (uid 0, SYS_ADMIN).
#
# It reports, it does not gate: findings do not fail it (docs/linters.md says which are
# expected), a failing `ct lint` does, and a linter that cannot be built is skipped with
# its reason in the closing summary. Not part of `make test` or CI: the first build
# of the linters takes several minutes on two cores. They are built from the Go module proxy
# into a cache folder outside the checkout, keyed by their versions, so a second run builds
# nothing. Each is built inside its own downloaded module (`go mod download`, then `go
# install ./cmd`), not with `go install module@version`: that form refuses modules with
# replace directives (dashboard-linter has one) and fails here on the proxy's deprecation
# lookup (chart-testing). Where the proxy serves no usable version, name a source tree of
# the pinned tag instead (KUBE_LINTER_SRC, DASHBOARD_LINTER_SRC) or a built binary
# (POLARIS); without one that linter is skipped with the reason, and the run says so.
#
# Builds and linters run under `nice -n 19` with GOMAXPROCS=1: the machine is shared.
set -euo pipefail

KUBE_LINTER_VERSION=v0.8.3
# Polaris has no default: the module proxy here serves no version of it (see docs/linters.md).
POLARIS_VERSION=${POLARIS_VERSION:-}
CT_VERSION=v3.14.0
DASHBOARD_LINTER_VERSION=v0.1.1
YAMLLINT_VERSION=1.38.0
YAMALE_VERSION=6.1.0
KUBE_VERSION=1.36.3 # devenv/cluster/versions.env, as tests/test_chart.py renders

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
chart="$repo/charts/vllm-operator"
dashboard="$chart/files/dashboards/vllm-operator.json"
cache=${VLLM_OP_CACHE:-$HOME/.cache/vllm-operator}
bin="$cache/bin/linters-kube-linter-$KUBE_LINTER_VERSION-polaris-${POLARIS_VERSION:-none}-ct-$CT_VERSION-dashboard-linter-$DASHBOARD_LINTER_VERSION"
venv="$cache/linters-venv"

log() { echo "[lint-k8s $(date +%H:%M:%S)] $*" >&2; }
unavailable=()

# build NAME MODULE VERSION PACKAGE LDFLAGS [SOURCE_TREE]: $bin/NAME, built once.
build() {
  local name=$1 module=$2 version=$3 pkg=$4 ldflags=$5 src=${6:-} json
  [[ -x "$bin/$name" ]] && return 0
  if [[ -z "$src" ]]; then
    log "Downloading $module@$version from the module proxy"
    if ! json=$(cd / && nice -n 19 go mod download -json "$module@$version"); then
      log "The module proxy gave no usable $module@$version: $(sed -n 's/.*"Error": "\(.*\)".*/\1/p' <<<"$json")"
      return 1
    fi
    src=$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' <<<"$json")
  fi
  log "Building $name $version from $src (minutes, once)"
  mkdir -p "$bin"
  (cd "$src" && GOMAXPROCS=1 GOFLAGS="-mod=readonly -buildvcs=false" GOBIN="$bin" \
    nice -n 19 go install -ldflags "$ldflags" "./$pkg") || return 1
  # ct lint reads the chart schema and yamllint rules its release ships in etc/.
  if [[ "$name" == ct ]]; then mkdir -p "$bin/ct-etc" && cp "$src"/etc/*.yaml "$bin/ct-etc/"; fi
}

have() { [[ -x "$bin/$1" ]]; }

build ct github.com/helm/chart-testing/v3 "$CT_VERSION" ct \
  "-X github.com/helm/chart-testing/v3/ct/cmd.Version=$CT_VERSION" ||
  unavailable+=("ct: no build of github.com/helm/chart-testing/v3@$CT_VERSION")
build kube-linter golang.stackrox.io/kube-linter "$KUBE_LINTER_VERSION" cmd/kube-linter \
  "-X golang.stackrox.io/kube-linter/internal/version.version=$KUBE_LINTER_VERSION" \
  "${KUBE_LINTER_SRC:-}" ||
  unavailable+=("kube-linter: no build of golang.stackrox.io/kube-linter@$KUBE_LINTER_VERSION (set KUBE_LINTER_SRC to a source tree of that tag)")
build dashboard-linter github.com/grafana/dashboard-linter "$DASHBOARD_LINTER_VERSION" . "" \
  "${DASHBOARD_LINTER_SRC:-}" ||
  unavailable+=("dashboard-linter: no build of github.com/grafana/dashboard-linter@$DASHBOARD_LINTER_VERSION (set DASHBOARD_LINTER_SRC to a source tree of that tag)")
polaris=${POLARIS:-}
if [[ -z "$polaris" && -n "$POLARIS_VERSION" ]]; then
  build polaris github.com/fairwindsops/polaris "$POLARIS_VERSION" . \
    "-X main.Version=$POLARIS_VERSION" && polaris="$bin/polaris"
fi
[[ -n "$polaris" ]] || unavailable+=("polaris: the module proxy serves no version of github.com/fairwindsops/polaris (set POLARIS to a built binary, or POLARIS_VERSION)")

# yamllint and yamale, which ct lint calls, in a venv of their own outside the checkout.
stamp="$venv/.installed-yamllint-$YAMLLINT_VERSION-yamale-$YAMALE_VERSION"
if [[ ! -f "$stamp" ]]; then
  log "Installing yamllint $YAMLLINT_VERSION and yamale $YAMALE_VERSION into $venv"
  python3 -m venv "$venv"
  nice -n 19 "$venv/bin/pip" install -q "yamllint==$YAMLLINT_VERSION" "yamale==$YAMALE_VERSION"
  touch "$stamp"
fi

helm_dir=${HELM_DIR:-$(bash "$repo/devenv/cluster/build.sh" | tail -n 1)}
export PATH="$helm_dir:$venv/bin:$PATH"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

optional=(
  --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true
  --set alerts.enabled=true --set dashboard.enabled=true
  --set kubeStateMetrics.customResourceState.enabled=true --set agent.enabled=true
)
declare -A renders=(
  [default]=""
  [optional]="${optional[*]}"
  [agent-power]="${optional[*]} --set agent.powerManagement=true"
)
order=(default optional agent-power)
for name in "${order[@]}"; do
  mkdir -p "$work/$name"
  # shellcheck disable=SC2086  # the --set words are split on purpose
  helm template vllm-operator "$chart" -n vllm-operator-system --kube-version "$KUBE_VERSION" \
    ${renders[$name]} >"$work/$name/chart.yaml"
done

status=0
section() { printf '\n== %s\n' "$*"; }

if have kube-linter; then
  for name in "${order[@]}"; do
    section "kube-linter $KUBE_LINTER_VERSION: $name values"
    # Exits 1 when it finds something; that is the report, not a failure.
    nice -n 19 "$bin/kube-linter" lint --config "$repo/.kube-linter.yaml" "$work/$name/chart.yaml" 2>&1 |
      sed "s|$work/||" || true
  done
fi

if [[ -n "$polaris" ]]; then
  for name in "${order[@]}"; do
    section "Polaris ${POLARIS_VERSION:-($polaris)}: $name values"
    nice -n 19 "$polaris" audit --audit-path "$work/$name" --format pretty \
      --only-show-failed-tests 2>&1 || true
  done
fi

if have ct; then
  for name in default optional; do
    section "ct lint $CT_VERSION: $name values"
    # --charts: no git diff against a target branch; no version bump to check; the
    # maintainers are no GitHub accounts to look up (and the network is not there).
    # shellcheck disable=SC2086
    (cd "$repo" && nice -n 19 "$bin/ct" lint --charts charts/vllm-operator \
      --validate-maintainers=false --check-version-increment=false \
      --lint-conf "$bin/ct-etc/lintconf.yaml" --chart-yaml-schema "$bin/ct-etc/chart_schema.yaml" \
      --helm-lint-extra-args "--kube-version $KUBE_VERSION ${renders[$name]}") 2>&1 || status=1
  done
fi

if have dashboard-linter; then
  section "dashboard-linter $DASHBOARD_LINTER_VERSION: ${dashboard#"$repo/"}"
  # .dashboard-linter.yaml's exclusions say why each stays. Only the findings are printed
  # (not the rule headers), without colours; nothing below the header: nothing found.
  nice -n 19 "$bin/dashboard-linter" lint -c "$repo/.dashboard-linter.yaml" "$dashboard" 2>&1 |
    sed 's/\x1b\[[0-9;]*m//g' | grep -v '^Checks that' || true
fi

section "Summary"
ran=()
for tool in kube-linter ct dashboard-linter; do have "$tool" && ran+=("$tool"); done
[[ -n "$polaris" ]] && ran+=(polaris)
echo "ran: ${ran[*]}"
for line in "${unavailable[@]}"; do echo "not run: $line"; done
[[ $status -eq 0 ]] || echo "ct lint failed"
exit "$status"
