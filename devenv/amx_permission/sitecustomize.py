"""Ask Linux for AMX tile state in every Python process of the host's CPU vLLM.

The CPU vLLM picks its AMX attention kernel on any x86 CPU that reports AMX and a bf16
model, but only torch's inductor asks the kernel for the permission AMX needs
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, per process). When vLLM runs
eagerly, as it does on CPU with LoRA enabled (vLLM 0.32), its spawned worker executes
AMX instructions without that permission and dies of SIGILL on the first request.
``devenv.vllm_server`` puts this folder on the server's ``PYTHONPATH`` so that each
process, the spawned workers included, asks first: the same request
``torch.cpu._init_amx()`` makes, without importing torch.

A CPU without AMX, or a kernel that refuses, leaves everything as it was.
"""

import ctypes
import platform

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def _request_amx() -> None:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            if " amx_tile" not in info.read():
                return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
    except OSError:
        return


_request_amx()
