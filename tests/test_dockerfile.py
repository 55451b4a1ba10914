"""The Dockerfile, kept honest without a container engine: hadolint lints it; its
structure is checked (pinned base, multi-stage, numeric non-root user with a USER and a
writable HOME, the entry point); and the same install it performs (the wheel, with every
dependency from deploy/image/constraints.txt, into a fresh virtual environment) is done
here, then the entry point the image runs is run, and `run` started as the image's uid.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.operator_start import LOGGED_IN, as_uid_without_passwd, start_and_stop

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
CONSTRAINTS = REPO / "deploy" / "image" / "constraints.txt"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[_norm(name)] = version
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    proc = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_would_complain_about_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install kopf\nUSER root\n")
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    proc = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "DL3007" in proc.stdout  # "latest" is flagged


def test_the_image_is_multi_stage_on_a_pinned_base() -> None:
    steps = _instructions()
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    bases = [a.split()[0] for w, a in steps if w == "FROM"]
    assert len(bases) >= 2, "multi-stage: a build stage and a runtime stage"
    for base in bases:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        _, _, tag = image.partition(":")
        assert "@sha256:" in image or re.fullmatch(r"\d+\.\d+\.\d+-slim-\w+", tag), image
        assert tag != "latest"
    # The runtime stage copies the environment from the build stage, nothing else.
    runtime = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    copies = [a for w, a in runtime if w == "COPY"]
    assert copies == ["--from=build /opt/vllm-operator /opt/vllm-operator"]
    assert not [w for w, _ in runtime if w == "RUN"], "nothing to install in the final stage"


def test_the_image_runs_as_a_numeric_non_root_user_with_the_entry_point() -> None:
    steps = _instructions()
    users = [a for w, a in steps if w == "USER"]
    assert users, "no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    # The chart runs the pod as the same user.
    values = (REPO / "charts" / "vllm-operator" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values and f"runAsGroup: {gid}" in values
    entry = [json.loads(a) for w, a in steps if w == "ENTRYPOINT"]
    assert entry[-1] == ["vllm-operator"]
    assert [json.loads(a) for w, a in steps if w == "CMD"][-1] == ["run"]


def _runtime_env() -> dict[str, str]:
    """The final stage's ENV, as name → value."""
    steps = _instructions()
    runtime = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    return dict(pair.split("=", 1) for w, a in runtime if w == "ENV" for pair in shlex.split(a))


def test_the_image_names_its_user_and_a_writable_home() -> None:
    # The uid has no passwd entry: getpass needs USER, Path.home() needs HOME.
    env = _runtime_env()
    assert env.get("USER"), "no USER: Kopf's default identity calls getpass.getuser()"
    # HOME is where the chart mounts its emptyDir below the read-only root.
    chart = REPO / "charts" / "vllm-operator"
    deployment = (chart / "templates" / "deployment.yaml").read_text()
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["containerSecurityContext"]["readOnlyRootFilesystem"] is True
    mounts = re.findall(r"- name: tmp\s+mountPath: (\S+)", deployment)
    assert mounts == [env.get("HOME")], f"HOME={env.get('HOME')}, emptyDir at {mounts}"


def test_every_pip_install_is_constrained_by_the_lock() -> None:
    installs = [a for w, a in _instructions() if w == "RUN" and "pip install" in a]
    assert installs
    for run in installs:
        assert "--constraint /src/constraints.txt" in run, run
    # The project with the agent extra, as the test below installs it.
    assert '"/src[agent]"' in installs[-1]


def test_the_lock_pins_every_requirement_within_pyprojects_ranges() -> None:
    from packaging.requirements import Requirement

    pins = _pins()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for raw in project["dependencies"] + project["optional-dependencies"]["agent"]:
        req = Requirement(raw)
        assert _norm(req.name) in pins, f"{req.name} is not pinned"
        assert req.specifier.contains(pins[_norm(req.name)]), f"{req.name} pin outside {req}"


def test_the_dockerignore_lets_in_what_the_dockerfile_copies() -> None:
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") + 1 :]  # everything else excluded
    for wanted in ("pyproject.toml", "README.md", "operator/", "deploy/image/constraints.txt"):
        assert f"!{wanted}" in ignore


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the build stage does, in a fresh venv: the wheel plus the pinned dependencies."""
    root = tmp_path_factory.mktemp("image")
    wheels = root / "wheels"
    pip_env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def run(*argv: str | Path) -> None:
        proc = subprocess.run(
            [str(a) for a in argv], capture_output=True, text=True, check=False, timeout=600,
            env={**pip_env, "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, REPO)
    (wheel,) = wheels.glob("vllm_operator-*.whl")
    venv = root / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "pip", "install", "--constraint", CONSTRAINTS, f"{wheel}[agent]")
    run(venv / "bin" / "pip", "check")
    return venv


def test_the_installed_environment_is_exactly_the_lock(image_venv: Path) -> None:
    proc = subprocess.run(
        [image_venv / "bin" / "pip", "freeze", "--exclude", "vllm-operator"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    installed = {
        _norm(n): v for n, _, v in (line.partition("==") for line in proc.stdout.splitlines())
    }
    assert installed == _pins()


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--version"], ["run", "--help"], ["agent", "--help"],
     ["crds", "--check", "--out", str(REPO / "crds")]],
    ids=lambda a: " ".join(a[:2]),
)  # fmt: skip
def test_the_entry_point_runs_from_the_installed_wheel(image_venv: Path, argv: list[str]) -> None:
    # From a folder outside the checkout, so nothing is imported from the source tree.
    proc = subprocess.run(
        [image_venv / "bin" / "vllm-operator", *argv],
        capture_output=True, text=True, check=False, timeout=60, cwd=image_venv,
        env={"PATH": f"{image_venv / 'bin'}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    if argv == ["--version"]:
        assert proc.stdout.strip() == "vllm-operator 0.1.0"
    where = subprocess.run(
        [image_venv / "bin" / "python", "-c", "import vllm_operator as v; print(v.__file__)"],
        capture_output=True, text=True, check=True, cwd=image_venv,
    )  # fmt: skip
    assert str(image_venv) in where.stdout, "imported from the source tree, not the wheel"


def test_run_starts_from_the_installed_wheel_as_the_images_uid(
    image_venv: Path, tmp_path: Path
) -> None:
    uid = int(next(a for w, a in reversed(_instructions()) if w == "USER").partition(":")[0])
    env = _runtime_env() | {"PATH": f"{image_venv / 'bin'}:/usr/bin:/bin"}
    argv = [*as_uid_without_passwd(uid), str(image_venv / "bin" / "vllm-operator")]
    code, output = start_and_stop(argv, env, tmp_path)
    assert LOGGED_IN in output, output
    assert "Traceback" not in output and code == 0, output
