"""devenv/amx_permission: the CPU vLLM's processes hold AMX tile permission from the start.

Without it an eager CPU vLLM (LoRA on) dies of SIGILL in its AMX attention kernel on the
first request (tests/vllm/test_adapters.py on this repo's Xeon machines).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devenv.vllm_server import AMX_PERMISSION_DIR, VllmServer

# arch_prctl(ARCH_GET_XCOMP_PERM) writes the permitted XSAVE features into a uint64.
ASK = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
mask = ctypes.c_uint64(0)
rc = libc.syscall(158, 0x1022, ctypes.byref(mask))
print(rc, mask.value)
"""
XTILEDATA = 1 << 18


def _permitted(pythonpath: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", ASK], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "0", f"arch_prctl(ARCH_GET_XCOMP_PERM) failed: {out}"
    return int(out[1])


def _has_amx() -> bool:
    return " amx_tile" in Path("/proc/cpuinfo").read_text(errors="replace")


@pytest.mark.skipif(not _has_amx(), reason="this CPU has no AMX: nothing to ask for")
def test_a_process_started_with_the_folder_on_its_path_may_use_amx_tiles() -> None:
    assert not _permitted(None) & XTILEDATA  # Linux grants it only on request
    assert _permitted(str(AMX_PERMISSION_DIR)) & XTILEDATA


def test_the_server_puts_the_folder_first_and_keeps_the_callers_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    server = VllmServer(tmp_path, python=sys.executable)
    assert server.environment()["PYTHONPATH"] == os.pathsep.join(
        [str(AMX_PERMISSION_DIR), "/somewhere/else"]
    )
    monkeypatch.delenv("PYTHONPATH")
    assert server.environment()["PYTHONPATH"] == str(AMX_PERMISSION_DIR)
