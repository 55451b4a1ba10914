"""What the local cluster can change on this host, read before and after a run.

``make cluster-down`` (and the end of the cluster tier) must undo what ``up`` did: the
node IP and the routes on ``lo``, the pod bridge, mounts under the kubelet's and
containerd's folders, network namespaces, iptables chains and rules, the kubepods
cgroups, the cluster's processes, the sysctls the kubelet rewrites and the folders it
makes. ``python -m devenv.host_state --out FILE`` writes a snapshot of all of them;
``--compare FILE`` reads the host again and exits 1 when something is there now that was
not before (a leak), naming it. What was there before and is gone now (a crashed earlier
cluster's route, cleaned up by this one's ``down``) is reported, not failed: undoing more
than one's own changes is no leak. ``.ci/run`` takes a snapshot before ``make test`` and
compares after it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from devenv.cluster import components, node

# The chains every iptables table has from its creation (the kernel makes a table, with
# these, the first time anything reads it): not something the cluster left behind.
BUILTIN_CHAINS = frozenset({"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"})
# Processes of the cluster, by their command name (/proc/PID/comm, 15 characters at most).
PROCESSES = frozenset(
    name[:15]
    for name in (
        *components.COMPONENTS,
        *node.COMPONENTS,
        # What those start under other names: the apiserver proxy is a socat, containerd
        # runs a shim per pod; and the LWS controller of the multi-node tests.
        "socat",
        "containerd-shim-runc-v2",
        "lws-controller",
    )
)

Snapshot = dict[str, list[str]]


def _lines(*argv: str) -> list[str]:
    if shutil.which(argv[0]) is None:
        return []
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    return [line.rstrip() for line in done.stdout.splitlines() if line.strip()]


def _addresses() -> list[str]:
    out = []
    for line in _lines("ip", "-o", "addr", "show"):
        words = line.split()
        if len(words) >= 4:
            out.append(f"{words[1]} {words[2]} {words[3]}")
    return sorted(out)


def _links() -> list[str]:
    out = []
    for line in _lines("ip", "-o", "link", "show"):
        words = line.split()
        if len(words) >= 2:
            out.append(words[1].rstrip(":").split("@")[0])
    return sorted(out)


def iptables_entries(dump: str, table: str, tool: str = "iptables") -> list[str]:
    """The chains and rules of one table's ``iptables-save``, counters and the kernel's
    built-in chains left out."""
    out = []
    for line in dump.splitlines():
        if line.startswith(":"):
            chain = line[1:].split()[0]
            if chain not in BUILTIN_CHAINS:
                out.append(f"{tool} {table} chain {chain}")
        elif line.startswith("-A "):
            out.append(f"{tool} {table} {line}")
    return out


def _iptables() -> list[str]:
    out = []
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            dump = "\n".join(_lines(f"{tool}-save", "-t", table))
            out += iptables_entries(dump, table, tool)
    return sorted(out)


def _cgroups() -> list[str]:
    root = Path("/sys/fs/cgroup")
    if not root.is_dir():
        return []
    out = []
    for controller in root.iterdir():
        if controller.is_dir():
            out += [str(p) for p in controller.glob("kubepods*")]
    if (root / "kubepods").is_dir() or (root / "kubepods.slice").is_dir():
        out += [str(p) for p in root.glob("kubepods*")]
    return sorted(set(out))


def process_state(stat: str) -> tuple[str, str]:
    """(command name, state letter) from the text of /proc/PID/stat."""
    left, right = stat.index("("), stat.rindex(")")
    return stat[left + 1 : right], stat[right + 2 : right + 3]


def _processes() -> list[str]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, state = process_state(stat.read_text())
        except (OSError, ValueError):
            continue
        if name in PROCESSES and state != "Z":  # a zombie holds nothing but its pid
            found.add(name)
    return sorted(found)


def _sysctls() -> list[str]:
    out = []
    for name in node.SYSCTLS:
        path = Path("/proc/sys", name)
        if path.exists():
            out.append(f"{name}={path.read_text().strip()}")
    return out


def snapshot() -> Snapshot:
    netns = Path("/run/netns")
    return {
        "addresses": _addresses(),
        "routes": sorted(_lines("ip", "route", "show", "table", "all")),
        "links": _links(),
        "mounts": sorted(set(node.mount_points())),
        "netns": sorted(p.name for p in netns.iterdir()) if netns.is_dir() else [],
        "iptables": _iptables(),
        "cgroups": _cgroups(),
        "processes": _processes(),
        "sysctls": _sysctls(),
        "paths": sorted(p for p in node.HOST_PATHS if Path(p).exists()),
    }


def compare(
    before: Mapping[str, Sequence[str]], after: Mapping[str, Sequence[str]]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(what is there now and was not before, what was there before and is gone)."""
    added, removed = {}, {}
    for key in sorted(set(before) | set(after)):
        old, new = set(before.get(key, ())), set(after.get(key, ()))
        if new - old:
            added[key] = sorted(new - old)
        if old - new:
            removed[key] = sorted(old - new)
    return added, removed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devenv.host_state", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="write a snapshot of the host to this file")
    mode.add_argument("--compare", type=Path, help="compare the host with this snapshot")
    args = parser.parse_args(argv)
    if args.out is not None:
        args.out.write_text(json.dumps(snapshot(), indent=1))
        return 0
    before = json.loads(args.compare.read_text())
    added, removed = compare(before, snapshot())
    for key, items in removed.items():
        for item in items:
            print(f"host_state: gone since {args.compare} (cleaned up, not a leak): {key}: {item}")
    for key, items in added.items():
        for item in items:
            print(f"host_state: LEFT BEHIND: {key}: {item}")
    if added:
        print(f"host_state: the host has {sum(map(len, added.values()))} things it had not "
              f"when {args.compare} was written", file=sys.stderr)  # fmt: skip
        return 1
    print(f"host_state: nothing was left behind since {args.compare} was written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
