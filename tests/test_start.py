"""The operator starts as a uid with no passwd entry and no USER, LOGNAME or HOME: the
image's own 65532 without the Dockerfile's ENV, or an OpenShift random uid.

Before the fix it died at once: ``RuntimeError: Could not determine home directory`` from
``kubernetes_asyncio``'s import, then ``KeyError: 'getpwuid(): uid not found: 65532'``
from Kopf's default identity.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

import pytest

from tests.operator_start import LOGGED_IN, as_uid_without_passwd, start_and_stop, stripped_env
from vllm_operator.cli import ensure_home
from vllm_operator.handlers.operator import operator_identity

REPO = Path(__file__).resolve().parents[1]
IMAGE_UID = int(re.findall(r"^USER (\d+):", (REPO / "Dockerfile").read_text(), re.M)[-1])


def test_vllm_operator_run_gets_as_far_as_logging_in(tmp_path: Path) -> None:
    prefix = as_uid_without_passwd(IMAGE_UID)
    entry = Path(sys.executable).parent / "vllm-operator"
    code, output = start_and_stop([*prefix, str(entry)], stripped_env(), tmp_path)
    assert LOGGED_IN in output, output
    assert "Traceback" not in output, output
    assert code == 0, output


def test_the_identity_needs_no_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_entry(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for name in ("USER", "LOGNAME", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("pwd.getpwuid", no_entry)
    assert operator_identity() == f"vllm-operator@{socket.gethostname()}/{os.getpid()}"


@pytest.mark.parametrize(
    ("home", "passwd", "expected"),
    [
        (None, False, "/tmp"),
        ("/home/me", False, "/home/me"),
        (None, True, None),
    ],
    ids=[
        "no HOME and no passwd entry: HOME is the temporary directory",
        "a HOME is kept",
        "no HOME but a passwd entry: the entry's home serves, HOME stays unset",
    ],
)  # fmt: skip
def test_a_home_is_given_only_when_none_can_be_found(
    monkeypatch: pytest.MonkeyPatch, home: str | None, passwd: bool, expected: str | None
) -> None:
    import pwd

    def lookup(uid: int) -> pwd.struct_passwd:
        if not passwd:
            raise KeyError(uid)
        return pwd.struct_passwd(("me", "x", uid, uid, "", "/home/from-passwd", "/bin/sh"))

    monkeypatch.delenv("TMPDIR", raising=False)
    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    monkeypatch.setattr("pwd.getpwuid", lookup)
    ensure_home()
    assert os.environ.get("HOME") == expected
