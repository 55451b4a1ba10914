#!/usr/bin/env bash
# Captures, on a machine with real NVIDIA GPUs, what the agent's H200 test data is made of:
# nvidia-smi's own answers, the agent's raw NVML answer set and GPUNode (inventory, power
# policies in dry run, bandwidth probe), and a PyTorch copy on the same GPUs to compare the
# probe with. Everything here only reads: the agent runs with --print (always a dry run,
# its NVML reader refuses every set-call) and nothing else touches a GPU setting.
#
#   bash tests/agent/h200/capture.sh OUTDIR NAME   (result: OUTDIR/capture.tar.gz of NAME/)
#
# Needs: python3 with pydantic and nvidia-ml-py importable, the repo's operator/ on
# PYTHONPATH, nvidia-smi, and for the comparison PyTorch (skipped when absent).
set -uo pipefail
out=${1:?usage: capture.sh OUTDIR NAME}
name=${2:?usage: capture.sh OUTDIR NAME}
cap=$out/$name
mkdir -p "$cap"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
agent=(python3 -m vllm_operator.agent.cli --print --dry-run --node-name h200)
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

step "nvidia-smi"
nvidia-smi >"$cap/nvidia-smi.txt" 2>&1
nvidia-smi -q >"$cap/nvidia-smi-q.txt" 2>&1
nvidia-smi -q -x >"$cap/nvidia-smi-q.xml" 2>&1
nvidia-smi topo -m >"$cap/nvidia-smi-topo-m.txt" 2>&1
nvidia-smi nvlink -s >"$cap/nvidia-smi-nvlink-s.txt" 2>&1
nvidia-smi nvlink -R >"$cap/nvidia-smi-nvlink-r.txt" 2>&1
q=index,uuid,name,memory.total,compute_cap,power.limit,enforced.power.limit,power.default_limit
q=$q,power.min_limit,power.max_limit,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem
q=$q,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max
q=$q,temperature.gpu,pci.bus_id,driver_version
nvidia-smi --query-gpu=$q --format=csv >"$cap/nvidia-smi-query.csv" 2>&1
nvidia-smi --query-gpu=index,power.limit --format=csv,noheader >"$cap/limits-before.csv"
for bdf in $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader); do
  d=$(echo "${bdf#0000}" | tr 'A-F' 'a-f'); d=${d: -12}
  echo "$bdf numa_node=$(cat /sys/bus/pci/devices/$d/numa_node 2>&1) local_cpulist=$(cat /sys/bus/pci/devices/$d/local_cpulist 2>&1)"
done >"$cap/sysfs.txt" 2>&1

step "agent inventory (dry run, no apiserver)"
"${agent[@]}" --dump-nvml "$cap/nvml.json" >"$cap/gpunode.json" 2>"$cap/agent.log"

step "agent power policies (dry run)"
for p in "Default" "Max" "Watts --watts 500" "Watts --watts 900" "Watts --watts 100"; do
  file=$(echo "$p" | awk '{print tolower($1) ($3 ? "-" $3 : "")}')
  # shellcheck disable=SC2086
  "${agent[@]}" --policy $p >"$cap/gpunode-policy-$file.json" 2>>"$cap/agent.log"
done

step "agent bandwidth probe (twice, for repeatability)"
for i in 1 2; do
  "${agent[@]}" --probe >"$cap/gpunode-probe-$i.json" 2>>"$cap/agent.log"
done

step "framework copy"
python3 "$here/framework_copy.py" >"$cap/framework-copy.json" 2>>"$cap/agent.log"

nvidia-smi --query-gpu=index,power.limit --format=csv,noheader >"$cap/limits-after.csv"
if cmp -s "$cap/limits-before.csv" "$cap/limits-after.csv"; then
  step "power limits unchanged: $(tr '\n' ' ' <"$cap/limits-after.csv")"
else
  step "POWER LIMITS DIFFER (before/after):"; cat "$cap/limits-before.csv" "$cap/limits-after.csv" >&2
fi
cat "$cap/agent.log" >&2
tar -C "$out" -czf "$out/capture.tar.gz" "$name" && rm -rf "$cap"
ls -la "$out"
