"""The command-line arguments of `vllm serve`, per vLLM release, read from vLLM's own source.

A maintainer's tool: it needs the network (PyPI) and the CPU vLLM venv of
scripts/vllm-cpu.sh, takes minutes, and is NOT run by CI or the tests. Its output,
operator/vllm_operator/releases/vllm_flags.json, is committed; docs/vllm-flags.md explains it.

    .venv/bin/python scripts/vllm_flags.py                       # 0.10 ... latest minor
    .venv/bin/python scripts/vllm_flags.py --versions 0.34.0     # add/refresh some
    .venv/bin/python scripts/vllm_flags.py --compare-ast 0.10.0,0.32.0

For each release (the first of each minor version, or --versions):

1. Download its sdist from PyPI once into ~/.cache/vllm-operator/vllm-sdists/<version>/
   (sha256 checked) and extract only its vllm/ package folder. A release without an sdist
   (0.15) is read from its x86_64 wheel by HTTP range requests, pure-Python files only.
2. "import" method: in a subprocess of the CPU vLLM venv's python (the one that
   `scripts/vllm-cpu.sh --check` prints; that venv is never changed) with the release's
   folder first on sys.path, build the release's own `vllm serve` parser
   (vllm/entrypoints/cli/serve.py, ServeSubcommand.subparser_init) and dump every option:
   option strings, action, type, choices, nargs, default, deprecation. A few pure-Python
   requirements that the venv lacks go into ~/.cache/vllm-operator/vllm-flags-deps
   (pip --target), appended to sys.path after the venv's own packages.
3. Where the import fails, "ast" method: a static read of the release's parser code
   (an approximation; --compare-ast measures it against the import where both work).
4. Calibration: the installed CPU vLLM's own parser is dumped the same way and compared
   with the table's entry for that version; the result goes into the table.

Idempotent: downloads, extractions and per-version dumps are cached (keyed by this
file's code), and the table is rewritten only when its content changes. A run for some
versions keeps the table's other versions. Env VLLM_OP_CACHE moves the cache root.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urljoin


def _index_url() -> str:
    """PyPI's JSON API for vllm; the address is pip's own constant for PyPI."""
    if os.environ.get("VLLM_FLAGS_INDEX"):
        return os.environ["VLLM_FLAGS_INDEX"]
    from pip._internal.models.index import PyPI  # the one place the address is kept

    return f"{PyPI.pypi_url}/vllm/json"


INDEX = _index_url()
CACHE = Path(os.environ.get("VLLM_OP_CACHE", Path.home() / ".cache" / "vllm-operator"))
SDISTS = CACHE / "vllm-sdists"


def log(msg: str) -> None:
    print(f"[vllm-flags] {msg}", file=sys.stderr, flush=True)


def _get(url: str, headers: dict[str, str] | None = None, tries: int = 4) -> bytes:
    for attempt in range(tries):
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=120) as resp:
                return bytes(resp.read())
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            if attempt == tries - 1:
                raise
            log(f"retrying {url.rsplit('/', 1)[-1]} after {exc}")
            time.sleep(2 * (attempt + 1))
    raise AssertionError("unreachable")


_PROJECT: dict[str, Any] = {}


def project_meta() -> dict[str, Any]:
    """PyPI's JSON for the whole project (one request; the per-release files are in it)."""
    if not _PROJECT:
        _PROJECT.update(json.loads(_get(INDEX)))
    return _PROJECT


def release_files(version: str) -> list[dict[str, Any]]:
    files = project_meta()["releases"].get(version)
    if not files:
        raise RuntimeError(f"vllm {version} is not on PyPI")
    return [{**f, "url": urljoin(INDEX, f["url"])} for f in files if not f.get("yanked")]


def pick_artifact(version: str) -> dict[str, Any]:
    """The release's sdist; where there is none, its x86_64 wheel (read by ranges)."""
    files = release_files(version)
    sdists = [f for f in files if f["packagetype"] == "sdist"]
    if sdists:
        return sdists[0]
    wheels = [f for f in files if f["packagetype"] == "bdist_wheel" and "x86_64" in f["filename"]]
    if not wheels:
        raise RuntimeError(f"vllm {version}: neither an sdist nor an x86_64 wheel on PyPI")
    return wheels[0]


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests.

    zipfile needs only the central directory and the members it reads, so a few MB of
    a 500 MB wheel come over the wire instead of all of it.
    """

    BLOCK = 1 << 20

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0
        self._cache: dict[int, bytes] = {}
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _block(self, n: int) -> bytes:
        if n not in self._cache:
            start = n * self.BLOCK
            end = min(self.size, start + self.BLOCK) - 1
            data = _get(self.url, {"Range": f"bytes={start}-{end}"})
            if len(data) != end - start + 1:
                raise OSError(f"range {start}-{end}: got {len(data)} bytes")
            self.fetched += len(data)
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[n] = data
        return self._cache[n]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        out = bytearray()
        while n > 0:
            blk, off = divmod(self.pos, self.BLOCK)
            chunk = self._block(blk)[off : off + n]
            out += chunk
            self.pos += len(chunk)
            n -= len(chunk)
        return bytes(out)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


# Members of a wheel's vllm/ that are not needed to build the parser (compiled code).
_BINARY_SUFFIXES = (".so", ".cubin", ".fatbin", ".a", ".o")


def ensure_source(version: str) -> dict[str, Any]:
    """Download (once) the release's artifact and extract its vllm/ folder.

    Layout: SDISTS/<version>/{<artifact>, src/vllm/..., artifact.json}. artifact.json is
    written last, so its presence means the extraction is complete.
    """
    vdir = SDISTS / version
    marker = vdir / "artifact.json"
    if marker.exists():
        return dict(json.loads(marker.read_text()))
    vdir.mkdir(parents=True, exist_ok=True)
    art = pick_artifact(version)
    src = vdir / "src"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir()
    want = art["digests"]["sha256"]
    if art["packagetype"] == "sdist":
        path = vdir / art["filename"]
        if not (path.exists() and _sha256(path) == want):
            log(f"{version}: downloading {art['filename']} ({art['size'] / 1e6:.1f} MB)")
            tmp = path.with_suffix(".part")
            tmp.write_bytes(_get(art["url"]))
            if _sha256(tmp) != want:
                raise RuntimeError(f"{art['filename']}: sha256 mismatch")
            tmp.rename(path)
        prefix = f"{art['filename'].removesuffix('.tar.gz')}/vllm/"
        with tarfile.open(path, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
            for m in members:
                dest = src / m.name[len(prefix) - len("vllm/") :]
                dest.parent.mkdir(parents=True, exist_ok=True)
                fobj = tar.extractfile(m)
                assert fobj is not None
                dest.write_bytes(fobj.read())
        fetched = art["size"]
    else:
        # No sdist for this release: read the pure-Python part of its wheel by ranges.
        # The archive is not kept (it is hundreds of MB); the extracted files are.
        log(f"{version}: no sdist; reading vllm/*.py of {art['filename']} by HTTP ranges")
        rf = RangeFile(art["url"], int(art["size"]))
        with zipfile.ZipFile(io.BufferedReader(rf, buffer_size=1 << 20)) as zf:
            members = [
                i
                for i in zf.infolist()
                if i.filename.startswith("vllm/")
                and not i.is_dir()
                and not i.filename.endswith(_BINARY_SUFFIXES)
            ]
            for info in members:
                dest = src / info.filename
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(info))
        fetched = rf.fetched
    record = {
        "version": version,
        "filename": art["filename"],
        "packagetype": art["packagetype"],
        "sha256": want,
        "size": art["size"],
        "bytes_fetched": fetched,
        "files_extracted": len(members),
    }
    marker.write_text(json.dumps(record, indent=1) + "\n")
    log(f"{version}: extracted {len(members)} files of {art['filename']}")
    return record


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_versions() -> list[str]:
    """The first release of each minor version 0.10 ... latest, as PyPI lists them."""
    meta = project_meta()
    latest = tuple(int(x) for x in meta["info"]["version"].split(".")[:2])
    firsts: dict[tuple[int, int], tuple[int, ...]] = {}
    for v, files in meta["releases"].items():
        parts = v.split(".")
        if not all(p.isdigit() for p in parts) or not files:
            continue
        key = (int(parts[0]), int(parts[1]))
        if (0, 10) <= key <= latest:
            num = tuple(int(p) for p in parts)
            if key not in firsts or num < firsts[key]:
                firsts[key] = num
    return [".".join(map(str, firsts[k])) for k in sorted(firsts)]


# ---------------------------------------------------------------------------------------
# Method 1: "import" -- run the release's own parser builder.
# ---------------------------------------------------------------------------------------

# Runs in a subprocess of the CPU vLLM venv's python with the release's extracted source
# first on sys.path: builds `vllm serve`'s parser exactly as the release's CLI does
# (vllm/entrypoints/cli/serve.py: ServeSubcommand.subparser_init on a subparsers action
# of the release's own FlexibleArgumentParser) and prints the dump as JSON on the last line.
DRIVER = r'''
import argparse, enum, json, os, re, sys
src, distinfo, deps, shims = sys.argv[1:5]
if "torch_cpu_avx512" in shims.split(","):
    # Releases that call torch._C._cpu._is_avx512_supported (a private name the newer
    # torch dropped; torch.cpu keeps it) when importing the CPU kernels.
    import torch
    for name in ("_is_avx512_supported", "_is_avx512_bf16_supported"):
        if not hasattr(torch._C._cpu, name) and hasattr(torch.cpu, name):
            setattr(torch._C._cpu, name, getattr(torch.cpu, name))
if src:
    sys.path.insert(0, src)
if distinfo:  # importlib.metadata.version("vllm") -> "<version>+cpu" (platform detection)
    sys.path.insert(0, distinfo)
if deps:  # last: only supplies what the venv lacks
    sys.path.append(deps)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# From 0.11 on, get_kwargs() puts the fields' docstrings into the help only when "--help"
# is in sys.argv (deprecation notes live there). Without "serve" in it, add_cli_args still
# registers --model (it skips it only for `vllm serve --help`).
sys.argv = ["vllm", "--help"]
import vllm
if src and not os.path.abspath(vllm.__file__).startswith(os.path.abspath(src)):
    raise SystemExit(f"vllm came from {vllm.__file__}, not {src}")
import vllm.entrypoints.cli.serve as serve_mod

subcmds = [c for c in serve_mod.cmd_init() if getattr(c, "name", None) == "serve"]
assert len(subcmds) == 1, subcmds
top = serve_mod.FlexibleArgumentParser(prog="vllm")
subparsers = top.add_subparsers(dest="subparser")
parser = subcmds[0].subparser_init(subparsers)

BUILTIN = {
    argparse._StoreAction: "store", argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false", argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append", argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count", argparse._ExtendAction: "extend",
}

def type_name(t, depth=0):
    """int, str, optional_type(int), parse_dataclass(CompilationConfig), lambda, ..."""
    if t is None:
        return None
    if isinstance(t, type):
        return t.__name__
    qn = getattr(t, "__qualname__", None) or type(t).__name__
    if "<locals>" not in qn:
        return qn
    parts = qn.split(".<locals>.")
    name, outer = parts[-1], parts[-2].rsplit(".", 1)[-1]
    if name == "<lambda>":
        name = "lambda"
    elif name.lstrip("_") == outer.lstrip("_"):
        name = outer  # optional_type.<locals>._optional_type -> optional_type
    inner = []
    if depth < 3:
        vals = []
        for cell in getattr(t, "__closure__", None) or ():
            try:
                vals.append(cell.cell_contents)
            except ValueError:
                pass
        vals += list(getattr(t, "__defaults__", None) or ())
        for c in vals:
            if isinstance(c, type) or (callable(c) and hasattr(c, "__qualname__")):
                inner.append(type_name(c, depth + 1))
    return f"{name}({', '.join(inner)})" if inner else name

def safe(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, enum.Enum):
        return safe(v.value)
    if isinstance(v, (list, tuple)):
        return [safe(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((safe(x) for x in v), key=repr)
    if isinstance(v, dict):
        return {str(k): safe(x) for k, x in v.items()}
    return repr(v)

# A sentence of the help that says this option is deprecated ("[DEPRECATED] ...",
# "Deprecated: ...", "... is deprecated ..."), not one that mentions deprecated things.
DEPRECATED_SENTENCE = re.compile(
    r"^\W*deprecated\b|\b(?:is|are|been|now|was)\s+(?:now\s+)?deprecated\b", re.I
)

def deprecation_note(help_text):
    for sentence in re.split(r"(?<=[.!])\s+", " ".join(help_text.split())):
        if DEPRECATED_SENTENCE.search(sentence):
            return sentence[:240]
    return None

deprecated_set = set()
for holder in [parser, *parser._action_groups]:
    deprecated_set |= set(getattr(holder, "_deprecated", ()) or ())

flags, positionals = {}, []
for a in parser._actions:
    if isinstance(a, argparse._HelpAction):
        continue
    kind = BUILTIN.get(type(a)) or type(a).__name__
    help_text = a.help if isinstance(a.help, str) else ""
    entry = {
        "action": kind,
        "type": type_name(a.type),
        "choices": safe(list(a.choices)) if a.choices is not None else None,
        "nargs": a.nargs,
        "default": safe(a.default),
        "deprecated": False,
    }
    if a.metavar is not None:
        entry["metavar"] = safe(a.metavar)
    note = deprecation_note(help_text.replace("%%", "%"))
    if a in deprecated_set or getattr(a, "deprecated", False) or note:
        entry["deprecated"] = True
        if note:
            entry["deprecation"] = note
    if not a.option_strings:
        positionals.append({"dest": a.dest, **entry})
        continue
    longs = [o for o in a.option_strings if o.startswith("--")]
    key = longs[0] if longs else a.option_strings[0]
    entry["aliases"] = [o for o in a.option_strings if o != key]
    # Accepted but left out of the help (0.33's EnableDisableAction keeps --no-enable-x).
    hidden = [o for o, act in parser._option_string_actions.items()
              if act is a and o not in a.option_strings]
    if hidden:
        entry["hidden_aliases"] = hidden
    if key in flags:
        raise SystemExit(f"duplicate option {key}")
    flags[key] = entry
# Values that argparse does not enumerate (no choices) but the release's own registries
# accept; they are checked when the engine config is built. Plugins can add more.
import typing
values = {}
def _try(flag, get):
    try:
        values[flag] = [safe(x) for x in get()]
    except Exception:  # a registry this release does not have
        values[flag] = None
def _cache_dtypes():
    try:
        from vllm.config.cache import CacheDType
    except ImportError:
        from vllm.config import CacheDType
    return typing.get_args(CacheDType)
def _load_formats():
    import vllm.model_executor.model_loader as ml
    if hasattr(ml, "_LOAD_FORMAT_TO_MODEL_LOADER"):
        return sorted(ml._LOAD_FORMAT_TO_MODEL_LOADER)
    from vllm.config import LoadFormat
    return [f.value for f in LoadFormat]
def _quant():
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    return list(QUANTIZATION_METHODS)
_try("--quantization", _quant)
_try("--load-format", _load_formats)
_try("--kv-cache-dtype", _cache_dtypes)
print(json.dumps({"flags": flags, "positionals": positionals, "values": values,
                  "vllm_file": vllm.__file__, "python": sys.version.split()[0]}))
'''


def cpu_python() -> str:
    """The CPU vLLM venv's python, as scripts/vllm-cpu.sh --check prints it."""
    script = Path(__file__).resolve().parent / "vllm-cpu.sh"
    out = subprocess.run(
        ["bash", str(script), "--check"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"no CPU vLLM installed (run scripts/vllm-cpu.sh): {out.stderr}")
    return out.stdout.strip().splitlines()[-1]


# Pure-Python requirements of some releases that the CPU vLLM 0.32.0 venv lacks. They go
# into their own folder (pip --target), appended to sys.path after the venv's packages,
# so the venv itself is never changed.
EXTRA_DEPS = ["diskcache==5.6.3", "gguf>=0.13", "orjson>=3.11.6"]
DEPS_DIR = CACHE / "vllm-flags-deps"


def ensure_deps(python: str) -> Path:
    marker = DEPS_DIR / ".installed"
    if marker.exists() and marker.read_text().split() == EXTRA_DEPS:
        return DEPS_DIR
    log(f"installing {' '.join(EXTRA_DEPS)} into {DEPS_DIR} (not into the venv)")
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--upgrade",
            "--target",
            str(DEPS_DIR),
            *EXTRA_DEPS,
        ],
        check=True,
    )
    marker.write_text(" ".join(EXTRA_DEPS) + "\n")
    return DEPS_DIR


# Narrow compatibility shims for the dependencies (never for vLLM's own code), each applied
# only when a release's import fails with its signature; the table records which were used.
SHIMS = {"torch_cpu_avx512": "torch._C._cpu' has no attribute '_is_avx512"}


def import_dump_with_shims(
    python: str, src: Path | None, deps: Path | None = None
) -> dict[str, Any]:
    shims: list[str] = []
    while True:
        try:
            out = import_dump(python, src, deps, shims)
            out["shims"] = shims
            return out
        except RuntimeError as exc:
            new = [n for n, sig in SHIMS.items() if sig in str(exc) and n not in shims]
            if not new:
                raise
            shims += new


def import_dump(
    python: str,
    src: Path | None,
    deps: Path | None = None,
    shims: list[str] | None = None,
    timeout: int = 600,
) -> dict[str, Any]:
    """Run DRIVER; src=None builds the parser of the venv's own installed vLLM.

    Releases before 0.28 detect the CPU platform only from the installed distribution's
    version ("...+cpu" in importlib.metadata.version("vllm")); the venv's distribution is
    named vllm-cpu, so a minimal vllm-<version>+cpu.dist-info goes first on sys.path.
    """
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as cwd:  # nothing in the cwd shadows vllm
        distinfo = ""
        if src is not None:
            version = source_version(src)
            di = Path(cwd) / "meta" / f"vllm-{version}+cpu.dist-info"
            di.mkdir(parents=True)
            (di / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
            )
            distinfo = str(di.parent)
        proc = subprocess.run(
            [
                python,
                "-c",
                DRIVER,
                str(src) if src else "",
                distinfo,
                str(deps or ""),
                ",".join(shims or []),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        raise RuntimeError("\n".join(tail))
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def source_version(src: Path) -> str:
    text = (src / "vllm" / "_version.py").read_text()
    m = re.search(r"^__version__ = version = '([^']+)'", text, re.M)
    if not m:
        raise RuntimeError(f"no version in {src}/vllm/_version.py")
    return m.group(1)


# ---------------------------------------------------------------------------------------
# Method 2: "ast" -- a static read of the release's parser code (the fallback).
# ---------------------------------------------------------------------------------------
# A small abstract interpreter over the release's source: it starts at
# ServeSubcommand.subparser_init in vllm/entrypoints/cli/serve.py, follows the calls that
# take the parser (make_arg_parser, X.add_cli_args, super()..., _customize_cli_kwargs),
# evaluates get_kwargs(ConfigClass) by reading the dataclass's fields (annotation, default,
# attribute docstring) and mimicking the release's _compute_kwargs rules, applies the
# kwargs edits it sees (x["f"]["type"] = ..., del, pop) and records every add_argument().
# What it cannot evaluate becomes a "<expr ...>" string. It knows nothing of plugins or
# platform hooks, and it is an approximation: the import method is the reference.


class _Unknown:
    def __init__(self, node: ast.AST | None) -> None:
        self.text = ast.unparse(node) if node is not None else "?"

    def __repr__(self) -> str:
        return f"<expr {self.text}>"


class _Parser:
    """A parser, argument group or subparsers action."""


class _Module:
    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path
        self.is_pkg = path.name == "__init__.py"
        self.tree = ast.parse(path.read_text())
        self.imports: dict[str, tuple[str, str | None]] = {}
        self.defs: dict[str, ast.AST] = {}
        self.assigns: dict[str, ast.expr] = {}
        self.star: list[str] = []
        self._collect(self.tree.body)

    def _collect(self, body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                self.defs[st.name] = st
            elif isinstance(st, ast.Assign) and len(st.targets) == 1:
                if isinstance(st.targets[0], ast.Name):
                    self.assigns[st.targets[0].id] = st.value
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value:
                self.assigns[st.target.id] = st.value
            elif isinstance(st, getattr(ast, "TypeAlias", ())):  # Python 3.12+
                self.assigns[st.name.id] = st.value
            elif isinstance(st, ast.ImportFrom):
                base = self.absolute(st.module, st.level)
                for a in st.names:
                    if a.name == "*":
                        self.star.append(base)
                    else:
                        self.imports[a.asname or a.name] = (base, a.name)
            elif isinstance(st, ast.Import):
                for a in st.names:
                    if a.asname:
                        self.imports[a.asname] = (a.name, None)
                    else:
                        self.imports[a.name.split(".")[0]] = (a.name.split(".")[0], None)
            elif isinstance(st, ast.If | ast.Try):
                self._collect(st.body)
                self._collect(getattr(st, "orelse", []))
                for h in getattr(st, "handlers", []):
                    self._collect(h.body)

    def absolute(self, module: str | None, level: int) -> str:
        if not level:
            return module or ""
        parts = self.name.split(".")
        if not self.is_pkg:
            parts = parts[:-1]
        parts = parts[: len(parts) - (level - 1)]
        return ".".join(parts + ([module] if module else []))


class _Src:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.mods: dict[str, _Module | None] = {}

    def module(self, name: str) -> _Module | None:
        if name not in self.mods:
            base = self.root / Path(*name.split("."))
            for path in (base.with_suffix(".py"), base / "__init__.py"):
                if name.startswith("vllm") and path.is_file():
                    self.mods[name] = _Module(name, path)
                    break
            else:
                self.mods[name] = None
        return self.mods[name]

    def lookup(self, mod: _Module, name: str, depth: int = 0) -> Any:
        """(module, node) of a module-level name, following imports; a _Module; or None."""
        if depth > 8:
            return None
        if name in mod.defs:
            return (mod, mod.defs[name])
        if name in mod.assigns:
            return (mod, mod.assigns[name])
        if name in mod.imports:
            target, attr = mod.imports[name]
            if attr is None:
                return self.module(target) or None
            m = self.module(target)
            if m is not None:
                found = self.lookup(m, attr, depth + 1)
                if found is not None:
                    return found
            return self.module(f"{target}.{attr}")
        for target in mod.star:
            m = self.module(target)
            found = self.lookup(m, name, depth + 1) if m is not None else None
            if found is not None:
                return found
        return None


class _Class:
    def __init__(self, mod: _Module, node: ast.ClassDef) -> None:
        self.mod, self.node = mod, node

    def __repr__(self) -> str:
        return self.node.name


class _Func:
    def __init__(self, mod: _Module, node: ast.FunctionDef, owner: _Class | None = None):
        self.mod, self.node, self.owner = mod, node, owner


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


_ACTION_NAMES = {
    "store_true": "store_true",
    "store_false": "store_false",
    "store_const": "store_const",
    "append": "append",
    "append_const": "append_const",
    "count": "count",
    "extend": "extend",
    "store": "store",
}
_ZERO_NARGS = {
    "store_true",
    "store_false",
    "store_const",
    "append_const",
    "count",
    "BooleanOptionalAction",
}


class _Interp:
    def __init__(self, src_root: Path) -> None:
        self.src = _Src(src_root)
        self.flags: dict[str, dict[str, Any]] = {}
        self.positionals: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.depth = 0
        au = self.src.module("vllm.engine.arg_utils")
        self.rules = self._probe_rules(au)

    # -- the release's _compute_kwargs rules, read from its text --------------------------
    def _probe_rules(self, au: _Module | None) -> dict[str, Any]:
        text = au.path.read_text() if au else ""
        fn = au.defs.get("_compute_kwargs") if au else None
        hr: set[str] = set()
        hr_auto: set[str] = set()
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Set) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
                ):
                    hr |= {e.value for e in node.elts}  # type: ignore[attr-defined]
            fn_text = ast.unparse(fn)
            if "human_readable_int_or_auto" in fn_text:
                m = re.search(
                    r"name == '(\w+)':\s*\n\s*kwargs\[name\]\['type'\] = "
                    r"human_readable_int_or_auto",
                    fn_text,
                )
                if m:
                    hr_auto.add(m.group(1))
        return {
            "none_choice": None if ".append(None)" in text else "None",
            "literal_metavar_with_str": '"metavar" if contains_type(type_hints, str)' in text,
            "sorted_literals": bool(re.search(r"sorted\((options|choices)\)", text)),
            "enable_disable": 'register("action", BooleanOptionalAction, EnableDisableAction)'
            in (self.src.root / "vllm" / "utils" / "argparse_utils.py").read_text()
            if (self.src.root / "vllm" / "utils" / "argparse_utils.py").exists()
            else False,
            "bool_str_none": "type_hints == {bool, str, type(None)}" in text,
            "set_collection": "collection_to_kwargs(type_hints, set)" in text,
            "human_readable": hr - hr_auto,
            "human_readable_auto": hr_auto,
        }

    # -- dataclass fields ---------------------------------------------------------------
    def resolve(self, mod: _Module, node: ast.expr) -> Any:
        if isinstance(node, ast.Name):
            return self.src.lookup(mod, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(mod, node.value)
            if isinstance(base, _Module):
                return self.src.lookup(base, node.attr)
        return None

    def as_class(self, found: Any) -> _Class | None:
        if isinstance(found, tuple) and isinstance(found[1], ast.ClassDef):
            return _Class(found[0], found[1])
        return None

    def mro(self, cls: _Class, depth: int = 0) -> list[_Class]:
        out = [cls]
        if depth < 10:
            for b in cls.node.bases:
                base = self.as_class(self.resolve(cls.mod, b))
                if base is not None:
                    out += [
                        c for c in self.mro(base, depth + 1) if c.node not in [o.node for o in out]
                    ]
        return out

    def is_dataclass(self, cls: _Class) -> bool:
        for d in cls.node.decorator_list:
            name = ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1]
            if name in ("dataclass", "config"):
                return True
        return False

    def fields(self, cls: _Class) -> list[tuple[_Module, str, ast.expr, ast.expr | None, str]]:
        seen: dict[str, tuple[_Module, str, ast.expr, ast.expr | None, str]] = {}
        for c in reversed(self.mro(cls)):
            if not self.is_dataclass(c) and c is not cls:
                continue
            body = c.node.body
            for i, st in enumerate(body):
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                    continue
                if "ClassVar" in ast.unparse(st.annotation) or "InitVar" in ast.unparse(
                    st.annotation
                ):
                    continue
                doc = ""
                nxt = body[i + 1] if i + 1 < len(body) else None
                if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                    doc = str(nxt.value.value)
                name = st.target.id
                seen.pop(name, None)  # a redefinition keeps the base's place in fields()
                seen[name] = (c.mod, name, st.annotation, st.value, doc)
        return list(seen.values())

    def flatten(self, mod: _Module, node: ast.expr | None, depth: int = 0) -> list[tuple]:
        """Union members of an annotation: ("none",) ("bool",) ("literal", vals) ..."""
        if node is None or depth > 12:
            return [("other", "?")]
        if isinstance(node, ast.Constant):
            if node.value is None:
                return [("none",)]
            if isinstance(node.value, str):
                try:
                    return self.flatten(mod, ast.parse(node.value, mode="eval").body, depth + 1)
                except SyntaxError:
                    return [("other", node.value)]
            return [("other", repr(node.value))]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.flatten(mod, node.left, depth + 1) + self.flatten(
                mod, node.right, depth + 1
            )
        if isinstance(node, ast.Subscript):
            head = ast.unparse(node.value).split(".")[-1]
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head == "Optional":
                return [*self.flatten(mod, args[0], depth + 1), ("none",)]
            if head == "Union":
                return [m for a in args for m in self.flatten(mod, a, depth + 1)]
            if head in ("Annotated", "SkipValidation", "Final", "Required", "NotRequired"):
                return self.flatten(mod, args[0], depth + 1)
            if head == "Literal":
                vals: list[Any] = []
                for a in args:
                    if isinstance(a, ast.Constant):
                        vals.append(a.value)
                    else:  # a Literal alias inside a Literal
                        for m in self.flatten(mod, a, depth + 1):
                            if m[0] == "literal":
                                vals += m[1]
                return [("literal", list(dict.fromkeys(vals)))]
            if head in ("list", "List", "Sequence", "MutableSequence"):
                return [("list", self.flatten(mod, args[0], depth + 1))]
            if head in ("set", "Set", "frozenset", "AbstractSet"):
                return [("set", self.flatten(mod, args[0], depth + 1))]
            if head in ("tuple", "Tuple"):
                ell = any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in args)
                inner = [
                    a for a in args if not (isinstance(a, ast.Constant) and a.value is Ellipsis)
                ]
                return [
                    (
                        "tuple",
                        self.flatten(mod, inner[0], depth + 1) if inner else [],
                        "+" if ell else len(inner),
                    )
                ]
            if head in ("dict", "Dict", "Mapping", "MutableMapping", "TypedDict"):
                return [("dict",)]
            if head in ("type", "Type", "Callable"):
                return [("other", head)]
            return self.flatten(mod, node.value, depth + 1)
        if isinstance(node, ast.Name | ast.Attribute):
            name = ast.unparse(node).split(".")[-1]
            simple = {
                "bool": "bool",
                "int": "int",
                "float": "float",
                "str": "str",
                "dict": "dict",
                "Dict": "dict",
                "list": "list",
                "List": "list",
                "NoneType": "none",
            }
            if name in simple:
                kind = simple[name]
                return [(kind, [("other", "Any")])] if kind == "list" else [(kind,)]
            if name == "Any":
                return [("other", "Any")]
            found = self.resolve(mod, node)
            if isinstance(found, tuple):
                fmod, fnode = found
                if isinstance(fnode, ast.ClassDef):
                    c = _Class(fmod, fnode)
                    bases = [ast.unparse(b).split(".")[-1] for b in fnode.bases]
                    if self.is_dataclass(c) or "BaseModel" in bases:
                        return [("dataclass", fnode.name)]
                    if any(b in ("dict", "TypedDict") for b in bases):
                        return [("dict",)]
                    return [("other", fnode.name)]
                if isinstance(fnode, ast.expr) and not isinstance(fnode, ast.Call):
                    return self.flatten(fmod, fnode, depth + 1)
            return [("other", name)]
        return [("other", ast.unparse(node))]

    def field_kwargs(
        self, mod: _Module, name: str, ann: ast.expr, default: ast.expr | None, doc: str
    ) -> dict[str, Any]:
        kw: dict[str, Any] = {"default": self.default_value(mod, default), "help": doc}
        members = self.flatten(mod, ann)
        kinds = {m[0] for m in members}
        r = self.rules

        def first(kind: str) -> tuple:
            return next(m for m in members if m[0] == kind)

        def scalar(ms: list[tuple]) -> str:
            for k in ("bool", "int", "float", "str"):
                if any(m[0] == k for m in ms):
                    return k
            lit = [m for m in ms if m[0] == "literal"]
            if lit and lit[0][1]:
                return type(lit[0][1][0]).__name__
            return "str"

        if "dataclass" in kinds:
            kw["type"] = f"parse_dataclass({first('dataclass')[1]})"
        elif r["bool_str_none"] and kinds == {"bool", "str", "none"}:
            kw.update(type="str", nargs="?")
        elif "bool" in kinds:
            kw["action"] = "BooleanOptionalAction"
        elif "literal" in kinds:
            vals = list(first("literal")[1])
            if r["sorted_literals"]:
                vals = sorted(vals, key=repr) if len({type(v) for v in vals}) > 1 else sorted(vals)
            kw["type"] = type(vals[0]).__name__ if vals else "str"
            if r["literal_metavar_with_str"] and "str" in kinds:
                kw["metavar"] = vals  # documented values, not enforced
            else:
                kw["choices"] = vals
        elif "tuple" in kinds:
            t = first("tuple")
            kw.update(type=scalar(t[1]), nargs=t[2])
        elif "list" in kinds:
            kw.update(type=scalar(first("list")[1]), nargs="+")
        elif "set" in kinds and r["set_collection"]:
            kw.update(type=scalar(first("set")[1]), nargs="+")
        elif "int" in kinds:
            if name in r["human_readable_auto"]:
                kw["type"] = "human_readable_int_or_auto"
            elif name in r["human_readable"]:
                kw["type"] = "human_readable_int"
            else:
                kw["type"] = "int"
        elif "float" in kinds:
            kw["type"] = "float"
        elif "dict" in kinds and ("str" in kinds or "other" in kinds):
            kw["type"] = "union_dict_and_str"
        elif "dict" in kinds:
            kw["type"] = "parse_type(loads)"
        else:
            kw["type"] = "str"
        if "none" in kinds and "bool" not in kinds:
            kw["type"] = f"optional_type({kw['type']})"
            if kw.get("choices"):
                kw["choices"] = [*kw["choices"], r["none_choice"]]
        return kw

    def default_value(self, mod: _Module, node: ast.expr | None, depth: int = 0) -> Any:
        if node is None:
            return None  # MISSING: a required field has no CLI default either
        if depth > 6:
            return _Unknown(node)
        if isinstance(node, ast.Call):
            fname = ast.unparse(node.func).split(".")[-1]
            kws = {k.arg: k.value for k in node.keywords if k.arg}
            if fname in ("field", "Field"):
                if "default" in kws:
                    return self.default_value(mod, kws["default"], depth + 1)
                if node.args and fname == "Field":
                    return self.default_value(mod, node.args[0], depth + 1)
                fac = kws.get("default_factory")
                if fac is not None:
                    if isinstance(fac, ast.Name) and fac.id in ("list", "dict", "set", "tuple"):
                        return {"list": [], "dict": {}, "set": [], "tuple": []}[fac.id]
                    if isinstance(fac, ast.Lambda):
                        return self.default_value(mod, fac.body, depth + 1)
                return _Unknown(node)
            if fname == "get_field" and len(node.args) == 2:
                cls = self.as_class(self.resolve(mod, node.args[0]))
                if cls and isinstance(node.args[1], ast.Constant):
                    for fm, fn, _a, fd, _d in self.fields(cls):
                        if fn == node.args[1].value:
                            return self.default_value(fm, fd, depth + 1)
            return _Unknown(node)
        if isinstance(node, ast.Attribute):  # ModelConfig.max_model_len, Enum.MEMBER
            cls = self.as_class(self.resolve(mod, node.value))
            if cls is not None:
                for fm, fn, _a, fd, _d in self.fields(cls):
                    if fn == node.attr:
                        return self.default_value(fm, fd, depth + 1)
                for st in cls.node.body:  # an enum member or class constant
                    if (
                        isinstance(st, ast.Assign)
                        and len(st.targets) == 1
                        and isinstance(st.targets[0], ast.Name)
                        and st.targets[0].id == node.attr
                    ):
                        return self.default_value(cls.mod, st.value, depth + 1)
            return _Unknown(node)
        if isinstance(node, ast.Name):
            found = self.src.lookup(mod, node.id)
            if isinstance(found, tuple) and isinstance(found[1], ast.expr):
                return self.default_value(found[0], found[1], depth + 1)
            return _Unknown(node)
        try:
            return ast.literal_eval(node)
        except (ValueError, SyntaxError, TypeError):
            return _Unknown(node)

    # -- the interpreter ----------------------------------------------------------------
    def call_func(
        self, f: _Func, args: list[Any], kwargs: dict[str, Any], self_value: Any = None
    ) -> Any:
        if self.depth > 25:
            return _Unknown(None)
        params = [a.arg for a in f.node.args.args]
        env: dict[str, Any] = {}
        decos = [ast.unparse(d) for d in f.node.decorator_list]
        if f.owner is not None and "staticmethod" not in decos and params:
            env[params[0]] = self_value if self_value is not None else f.owner
            params = params[1:]
        for p, v in zip(params, args, strict=False):
            env[p] = v
        env.update(kwargs)
        env["__class__"] = f.owner
        self.depth += 1
        try:
            self.exec_body(f.mod, f.node.body, env)
        except _Return as r:
            return r.value
        finally:
            self.depth -= 1
        return None

    def method(self, cls: _Class, name: str, after: _Class | None = None) -> _Func | None:
        chain = self.mro(cls)
        if after is not None:
            idx = (
                [c.node for c in chain].index(after.node)
                if after.node in [c.node for c in chain]
                else -1
            )
            chain = chain[idx + 1 :]
        for c in chain:
            for st in c.node.body:
                if isinstance(st, ast.FunctionDef) and st.name == name:
                    return _Func(c.mod, st, c)
        return None

    def exec_body(self, mod: _Module, body: list[ast.stmt], env: dict[str, Any]) -> None:
        for st in body:
            self.exec_stmt(mod, st, env)

    def exec_stmt(self, mod: _Module, st: ast.stmt, env: dict[str, Any]) -> None:
        if isinstance(st, ast.Return):
            raise _Return(self.ev(mod, st.value, env) if st.value else None)
        if isinstance(st, ast.Assign | ast.AnnAssign):
            value = self.ev(mod, st.value, env) if st.value is not None else None
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            for t in targets:
                self.assign(mod, t, value, env)
        elif isinstance(st, ast.Expr):
            self.ev(mod, st.value, env)
        elif isinstance(st, ast.Delete):
            for t in st.targets:
                if isinstance(t, ast.Subscript):
                    holder = self.ev(mod, t.value, env)
                    key = self.ev(mod, t.slice, env)
                    if isinstance(holder, dict) and isinstance(key, str):
                        holder.pop(key, None)
        elif isinstance(st, ast.If):
            cond = self.truth(mod, st.test, env)
            if cond is not False:
                self.exec_body(mod, st.body, env)
            if cond is not True:
                self.exec_body(mod, st.orelse, env)
        elif isinstance(st, ast.For):
            it = self.ev(mod, st.iter, env)
            if isinstance(it, list):
                for item in it:
                    self.assign(mod, st.target, item, env)
                    self.exec_body(mod, st.body, env)
        elif isinstance(st, ast.With):
            self.exec_body(mod, st.body, env)
        elif isinstance(st, ast.Try):
            self.exec_body(mod, st.body, env)
            self.exec_body(mod, st.orelse, env)
            self.exec_body(mod, st.finalbody, env)
        elif isinstance(st, ast.FunctionDef):
            env[st.name] = _Func(mod, st)
        elif isinstance(st, ast.ImportFrom):
            base = mod.absolute(st.module, st.level)
            target = self.src.module(base)
            for a in st.names:
                found = self.src.lookup(target, a.name) if target else None
                env[a.asname or a.name] = found if found is not None else _Unknown(None)

    def assign(self, mod: _Module, t: ast.expr, value: Any, env: dict[str, Any]) -> None:
        if isinstance(t, ast.Name):
            env[t.id] = value
        elif isinstance(t, ast.Tuple) and isinstance(value, tuple | list):
            for sub, v in zip(t.elts, value, strict=False):
                self.assign(mod, sub, v, env)
        elif isinstance(t, ast.Subscript):
            holder = self.ev(mod, t.value, env)
            key = self.ev(mod, t.slice, env)
            if isinstance(holder, dict) and isinstance(key, str):
                holder[key] = value

    def truth(self, mod: _Module, node: ast.expr, env: dict[str, Any]) -> bool | None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.truth(mod, node.operand, env)
            return None if inner is None else not inner
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
        ):
            left = self.ev(mod, node.left, env)
            right = self.ev(mod, node.comparators[0], env)
            if isinstance(right, dict) and isinstance(left, str):
                return (left in right) == isinstance(node.ops[0], ast.In)
        v = self.ev(mod, node, env)
        if isinstance(v, bool):
            return v
        return None

    def ev(self, mod: _Module, node: ast.expr, env: dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            found = self.src.lookup(mod, node.id)
            cls = self.as_class(found)
            if cls is not None:
                return cls
            if isinstance(found, tuple) and isinstance(found[1], ast.FunctionDef):
                return _Func(found[0], found[1])
            if isinstance(found, _Module):
                return found
            if isinstance(found, tuple) and isinstance(found[1], ast.expr):
                return self.default_value(found[0], found[1])
            return _Unknown(node)
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                x = self.ev(mod, v.value, env) if isinstance(v, ast.FormattedValue) else v.value
                if not isinstance(x, str | int):
                    return _Unknown(node)
                parts.append(str(x))
            return "".join(parts)
        if isinstance(node, ast.Subscript):
            holder = self.ev(mod, node.value, env)
            key = self.ev(mod, node.slice, env)
            if isinstance(holder, dict) and isinstance(key, str) and key in holder:
                return holder[key]
            return _Unknown(node)
        if isinstance(node, ast.Attribute):
            base = self.ev(mod, node.value, env)
            if isinstance(base, _Module):
                found = self.src.lookup(base, node.attr)
                cls = self.as_class(found)
                if cls is not None:
                    return cls
                if isinstance(found, tuple) and isinstance(found[1], ast.FunctionDef):
                    return _Func(found[0], found[1])
            if isinstance(base, _Class):
                f = self.method(base, node.attr)
                if f is not None:
                    return ("bound", f, base)
                return self.default_value(mod, node)
            return ("attr", base, node.attr)
        if isinstance(node, ast.Dict):
            out: dict[str, Any] = {}
            for k, v in zip(node.keys, node.values, strict=True):
                val = self.ev(mod, v, env)
                if k is None:
                    if isinstance(val, dict):
                        out.update(val)
                else:
                    key = self.ev(mod, k, env)
                    out[str(key)] = val
            return out
        if isinstance(node, ast.List | ast.Tuple):
            items: list[Any] = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    inner = self.ev(mod, e.value, env)
                    if isinstance(inner, list):
                        items += inner
                    else:
                        return _Unknown(node)
                else:
                    items.append(self.ev(mod, e, env))
            return items
        if isinstance(node, ast.Call):
            return self.call(mod, node, env)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = self.ev(mod, node.operand, env)
            return -v if isinstance(v, int | float) else _Unknown(node)
        return _Unknown(node)

    def call(self, mod: _Module, node: ast.Call, env: dict[str, Any]) -> Any:
        fn = node.func
        # super().name(...)
        if (
            isinstance(fn, ast.Attribute)
            and isinstance(fn.value, ast.Call)
            and isinstance(fn.value.func, ast.Name)
            and fn.value.func.id == "super"
        ):
            owner = env.get("__class__")
            me = env.get("cls") or env.get("self") or owner
            if isinstance(owner, _Class):
                f = self.method(me if isinstance(me, _Class) else owner, fn.attr, after=owner)
                if f is not None:
                    return self.invoke(mod, f, node, env, self_value=me)
            return _Unknown(node)
        if isinstance(fn, ast.Attribute):
            recv = self.ev(mod, fn.value, env)
            name = fn.attr
            if isinstance(recv, _Parser):
                if name == "add_argument":
                    self.add_argument(mod, node, env)
                    return _Parser()
                if name in (
                    "add_argument_group",
                    "add_mutually_exclusive_group",
                    "add_subparsers",
                    "add_parser",
                ):
                    return _Parser()
                return _Unknown(node)
            if isinstance(recv, dict):
                args = [self.ev(mod, a, env) for a in node.args]
                if name == "items":
                    return [(k, v) for k, v in list(recv.items())]
                if name == "keys":
                    return list(recv)
                if name == "pop" and args and isinstance(args[0], str):
                    return recv.pop(args[0], args[1] if len(args) > 1 else None)
                if name == "get" and args and isinstance(args[0], str):
                    return recv.get(args[0], args[1] if len(args) > 1 else None)
                if name == "update" and args and isinstance(args[0], dict):
                    recv.update(args[0])
                    return None
                if name == "setdefault" and args and isinstance(args[0], str):
                    return recv.setdefault(args[0], args[1] if len(args) > 1 else None)
                return _Unknown(node)
            if isinstance(recv, str):
                args = [self.ev(mod, a, env) for a in node.args]
                safe = {
                    "replace",
                    "lower",
                    "upper",
                    "strip",
                    "lstrip",
                    "rstrip",
                    "split",
                    "removeprefix",
                    "removesuffix",
                    "startswith",
                    "endswith",
                }
                if name in safe and all(isinstance(a, str | int) for a in args):
                    try:
                        return getattr(recv, name)(*args)
                    except (TypeError, ValueError):
                        return _Unknown(node)
                return _Unknown(node)
            if isinstance(recv, _Class):
                f = self.method(recv, name)
                if f is not None:
                    return self.invoke(mod, f, node, env, self_value=recv)
                return _Unknown(node)
            target = self.ev(mod, fn, env)
            if isinstance(target, _Func):
                return self.invoke(mod, target, node, env)
            return _Unknown(node)
        target = self.ev(mod, fn, env)
        fname = fn.id if isinstance(fn, ast.Name) else ""
        if fname == "get_kwargs" or (
            isinstance(target, _Func) and target.node.name == "get_kwargs"
        ):
            cls = self.ev(mod, node.args[0], env) if node.args else None
            if isinstance(cls, _Class):
                return {
                    n: self.field_kwargs(fm, n, a, d, doc) for fm, n, a, d, doc in self.fields(cls)
                }
            return _Unknown(node)
        if isinstance(target, _Func):
            return self.invoke(mod, target, node, env)
        if isinstance(target, _Class) and target.node.name.endswith("ArgumentParser"):
            return _Parser()
        if fname in ("list", "sorted") and node.args:
            v = self.ev(mod, node.args[0], env)
            if isinstance(v, dict):
                return sorted(v) if fname == "sorted" else list(v)
            if isinstance(v, list):
                return sorted(v, key=repr) if fname == "sorted" else list(v)
        return _Unknown(node)

    def invoke(
        self, mod: _Module, f: _Func, node: ast.Call, env: dict[str, Any], self_value: Any = None
    ) -> Any:
        args = [self.ev(mod, a, env) for a in node.args if not isinstance(a, ast.Starred)]
        kwargs = {k.arg: self.ev(mod, k.value, env) for k in node.keywords if k.arg}
        # Follow only the calls that carry a parser or a kwargs table.
        carried = [*args, *kwargs.values()]
        if not any(isinstance(a, _Parser | dict) for a in carried):
            return _Unknown(node)
        return self.call_func(f, args, kwargs, self_value=self_value)

    def add_argument(self, mod: _Module, node: ast.Call, env: dict[str, Any]) -> None:
        names: list[str] = []
        for a in node.args:
            v = self.ev(mod, a.value if isinstance(a, ast.Starred) else a, env)
            vals = v if isinstance(a, ast.Starred) else [v]
            if not isinstance(vals, list) or not all(isinstance(x, str) for x in vals):
                self.notes.append(f"unresolved option name in {ast.unparse(node)[:120]}")
                return
            names += vals
        kw: dict[str, Any] = {}
        for k in node.keywords:
            v = self.ev(mod, k.value, env)
            if k.arg is None:
                if isinstance(v, dict):
                    kw.update(v)
                else:
                    self.notes.append(f"unresolved **kwargs in {ast.unparse(node)[:120]}")
            else:
                kw[k.arg] = v
        self.record(names, kw)

    def record(self, names: list[str], kw: dict[str, Any]) -> None:
        act = kw.get("action")
        if act is None:
            action = "store"
        elif isinstance(act, str):
            action = _ACTION_NAMES.get(act, act)
        elif isinstance(act, _Class):
            action = act.node.name
        elif isinstance(act, tuple) and act[0] == "attr":
            action = act[2]
        elif isinstance(act, _Unknown):
            action = act.text.split(".")[-1]
        else:
            action = repr(act)
        typ = kw.get("type")
        if isinstance(typ, (_Class, _Func)):
            typ = typ.node.name
        elif isinstance(typ, tuple) and typ[0] == "attr":
            typ = typ[2]
        elif isinstance(typ, _Unknown):
            typ = typ.text.split(".")[-1] if re.fullmatch(r"[\w.]+", typ.text) else typ.text
        default = kw.get("default")
        if "default" not in kw:
            default = {"store_true": False, "store_false": True}.get(action)
        nargs = kw.get("nargs")
        if action in _ZERO_NARGS and "nargs" not in kw:
            nargs = 0
        choices = kw.get("choices")
        help_text = kw.get("help") if isinstance(kw.get("help"), str) else ""
        entry: dict[str, Any] = {
            "action": action,
            "type": typ if typ is None or isinstance(typ, str) else repr(typ),
            "choices": _json_safe(list(choices))
            if isinstance(choices, list)
            else (None if choices is None else repr(choices)),
            "nargs": nargs,
            "default": _json_safe(default),
            "deprecated": False,
        }
        if kw.get("metavar") is not None:
            entry["metavar"] = _json_safe(kw["metavar"])
        note = _deprecation_note(help_text)
        if kw.get("deprecated") is True or note:
            entry["deprecated"] = True
            if note:
                entry["deprecation"] = note
        opts = [n for n in names if n.startswith("-")]
        if not opts:
            self.positionals.append({"dest": names[0] if names else "?", **entry})
            return
        hidden: list[str] = []
        if action == "BooleanOptionalAction":
            negs = ["--no-" + o[2:] for o in opts if o.startswith("--")]
            if self.rules["enable_disable"]:  # 0.33+: --enable-x pairs with --disable-x
                action = entry["action"] = "EnableDisableAction"
                inverses = [
                    inv + o.removeprefix(pre)
                    for o in opts
                    for pre, inv in (("--enable-", "--disable-"), ("--disable-", "--enable-"))
                    if o.startswith(pre)
                ]
                if inverses:
                    opts, hidden = [*opts, *inverses], negs
                else:
                    opts = [
                        x
                        for o in opts
                        for x in ([o, "--no-" + o[2:]] if o.startswith("--") else [o])
                    ]
            else:
                opts = [
                    x for o in opts for x in ([o, "--no-" + o[2:]] if o.startswith("--") else [o])
                ]
        longs = [o for o in opts if o.startswith("--")]
        key = longs[0] if longs else opts[0]
        entry["aliases"] = [o for o in opts if o != key]
        if hidden:
            entry["hidden_aliases"] = hidden
        if key in self.flags:
            self.notes.append(f"{key} added twice (both branches of an if?); first kept")
            return
        self.flags[key] = entry


def _json_safe(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    return repr(v)


_DEPRECATED_SENTENCE = re.compile(
    r"^\W*deprecated\b|\b(?:is|are|been|now|was)\s+(?:now\s+)?deprecated\b", re.I
)


def _deprecation_note(help_text: str) -> str | None:
    for sentence in re.split(r"(?<=[.!])\s+", " ".join(help_text.replace("%%", "%").split())):
        if _DEPRECATED_SENTENCE.search(sentence):
            return sentence[:240]
    return None


def ast_dump(src: Path) -> dict[str, Any]:
    interp = _Interp(src)
    serve = interp.src.module("vllm.entrypoints.cli.serve")
    if serve is None:
        raise RuntimeError(f"{src}: no vllm/entrypoints/cli/serve.py")
    node = serve.defs.get("ServeSubcommand")
    if not isinstance(node, ast.ClassDef):
        raise RuntimeError("no ServeSubcommand class in vllm/entrypoints/cli/serve.py")
    cls = _Class(serve, node)
    f = interp.method(cls, "subparser_init")
    if f is None:
        raise RuntimeError("ServeSubcommand has no subparser_init")
    interp.call_func(f, [_Parser()], {}, self_value=cls)
    values: dict[str, Any] = {}
    for flag, modname, alias in (
        ("--quantization", "vllm.model_executor.layers.quantization", "QuantizationMethods"),
        ("--load-format", "vllm.model_executor.model_loader", "LoadFormats"),
        ("--kv-cache-dtype", "vllm.config.cache", "CacheDType"),
    ):
        mod = interp.src.module(modname) or interp.src.module("vllm.config")
        found = interp.src.lookup(mod, alias) if mod else None
        lits = None
        if isinstance(found, tuple) and isinstance(found[1], ast.expr):
            members = interp.flatten(found[0], found[1])
            lits = [v for m in members if m[0] == "literal" for v in m[1]] or None
        values[flag] = sorted(lits) if flag == "--load-format" and lits else lits
    return {
        "flags": interp.flags,
        "positionals": interp.positionals,
        "values": values,
        "notes": interp.notes,
    }


def compare_ast(version: str, imported: dict[str, Any]) -> dict[str, Any]:
    """Per field, how often the AST read agrees with the import (the reference)."""
    if imported.get("method") != "import":
        return {"skipped": "the table's entry is not from the import method"}
    dump = ast_dump(SDISTS / version / "src")
    a, b = dump["flags"], imported["flags"]
    common = sorted(set(a) & set(b))
    fields = (
        "action",
        "aliases",
        "hidden_aliases",
        "choices",
        "metavar",
        "default",
        "deprecated",
        "nargs",
        "type",
    )
    agree = {f: sum(a[k].get(f) == b[k].get(f) for k in common) for f in fields}
    examples = {
        f: [
            f"{k}: ast {a[k].get(f)!r} vs import {b[k].get(f)!r}"[:200]
            for k in common
            if a[k].get(f) != b[k].get(f)
        ][:6]
        for f in fields
    }
    return {
        "flags_import": len(b),
        "flags_ast": len(a),
        "only_import": sorted(set(b) - set(a)),
        "only_ast": sorted(set(a) - set(b)),
        "agree_of_common": {f: f"{n}/{len(common)}" for f, n in agree.items()},
        "values_agree": {
            f: dump["values"].get(f) == (imported.get("values") or {}).get(f)
            for f in dump["values"]
        },
        "examples": {f: e for f, e in examples.items() if e},
        "ast_notes": dump["notes"][:10],
    }


# ---------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "operator" / "vllm_operator" / "releases" / "vllm_flags.json"
PLAIN_LIMIT = 2_000_000  # bytes; above it the table would be stored as a diff chain


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def _cached(path: Path, key: str, make: Any) -> dict[str, Any]:
    """Per-version dumps are kept next to the source, keyed by the extractor's code."""
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("key") == key:
            return dict(data["dump"])
    dump = make()
    path.write_text(json.dumps({"key": key, "dump": dump}, sort_keys=True) + "\n")
    return dict(dump)


def _code_key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def extract_version(
    version: str, method: str, python: str | None, deps: Path | None
) -> dict[str, Any]:
    """{"method", "artifact", "flags", ...} of one release."""
    art = ensure_source(version)
    src = SDISTS / version / "src"
    artifact = art["filename"]
    if art["packagetype"] != "sdist":
        artifact += " (no sdist on PyPI; its pure-Python files)"
    entry: dict[str, Any] = {"artifact": artifact}
    if method in ("auto", "import") and python:
        try:
            key = _code_key(DRIVER, python, " ".join(EXTRA_DEPS), repr(sorted(SHIMS.items())))
            dump = _cached(
                SDISTS / version / "flags-import.json",
                key,
                lambda: import_dump_with_shims(python, src, deps),
            )
            entry.update(
                method="import",
                shims=dump["shims"],
                positionals=dump["positionals"],
                values=dump["values"],
            )
            entry["flags"] = dump["flags"]
            return entry
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            if method == "import":
                raise
            entry["import_error"] = str(exc).strip().splitlines()[-1][:300]
            log(f"{version}: import failed ({entry['import_error']}); reading the AST")
    dump = _cached(
        SDISTS / version / "flags-ast.json", _code_key(_ast_code()), lambda: ast_dump(src)
    )
    entry.update(
        method="ast", positionals=dump["positionals"], values=dump["values"], flags=dump["flags"]
    )
    return entry


def _ast_code() -> str:
    import inspect

    return inspect.getsource(sys.modules[__name__])  # the AST reader is this module's code


def calibrate(python: str, versions: dict[str, Any]) -> dict[str, Any]:
    """Build the installed CPU vLLM's own parser and compare it with the release's entry."""
    probe = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    installed = probe.stdout.strip().split("+")[0]
    result: dict[str, Any] = {"installed": f"vllm-cpu {installed}"}
    if installed not in versions:
        result["result"] = "skipped: that version is not in the table"
        return result
    real = import_dump(python, None)
    mine = versions[installed]
    diffs = sorted(
        k
        for k in set(real["flags"]) | set(mine["flags"])
        if real["flags"].get(k) != mine["flags"].get(k)
    )
    if real["positionals"] != mine.get("positionals"):
        diffs.append("(positionals)")
    if real["values"] != mine.get("values"):
        diffs.append("(values)")
    result.update(
        version=installed,
        flags_installed=len(real["flags"]),
        flags_table=len(mine["flags"]),
        differing=diffs,
        result="identical" if not diffs else f"{len(diffs)} entries differ",
    )
    return result


SOURCE = (
    "Generated by scripts/vllm_flags.py (a maintainer's tool; not run by CI) from vLLM's "
    "own source of each release on PyPI: the sdist of the first release of each minor "
    "version (0.15 has no sdist: the pure-Python files of its x86_64 wheel). method "
    "'import': the release's own `vllm serve` parser "
    "(vllm/entrypoints/cli/serve.py: ServeSubcommand.subparser_init on the release's "
    "FlexibleArgumentParser), built in a subprocess of the {cpu} (CPU vLLM) venv's python "
    "with the release's vllm/ folder first on sys.path, VLLM_TARGET_DEVICE=cpu, a "
    "vllm-<version>+cpu dist-info for platform detection, {deps} appended after the venv's "
    "packages, and only the shims listed per version; every option of that parser is "
    "dumped. method 'ast': a static read of the release's parser modules (fallback). "
    "Keys are the first long option string; 'aliases' holds the others (short forms, "
    "--no-X of BooleanOptionalAction, --disable-X of 0.33's EnableDisableAction); "
    "'hidden_aliases' the accepted ones that the help leaves out. "
    "FlexibleArgumentParser also accepts underscores "
    "for dashes (--max_model_len) and --json-arg.key for JSON options; those spellings "
    "are not listed. Defaults are the parser's as seen on the CPU platform (engine "
    "defaults resolved later, e.g. per GPU or per usage context, are not in them). "
    "'deprecated': marked deprecated=True or its help says so ('deprecation' quotes it). "
    "'metavar': as the parser has it (0.33 lists --kv-cache-dtype's values there instead of "
    "in choices). Per version, 'values' lists what the release's own registries accept for "
    "options that argparse does not enumerate (--quantization: QUANTIZATION_METHODS; "
    "--load-format: the model-loader registry; --kv-cache-dtype: CacheDType); they are "
    "checked when the engine config is built, and plugins can register more."
)


def write_table(table: dict[str, Any], out: Path) -> int:
    """Sorted keys; one line per flag entry (compact, yet diffs stay readable)."""

    def dumps(value: Any, depth: int) -> str:
        if depth >= 4 or not isinstance(value, dict) or not value:
            return json.dumps(value, sort_keys=True, ensure_ascii=True)
        pad = " " * (depth + 1)
        items = [f"{pad}{json.dumps(k)}: {dumps(value[k], depth + 1)}" for k in sorted(value)]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"

    text = dumps(table, 0) + "\n"
    json.loads(text)  # valid JSON, same content
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return len(text.encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--versions",
        help="comma-separated releases (default: first of each "
        "minor version from 0.10 to the latest on PyPI)",
    )
    ap.add_argument(
        "--method",
        choices=["auto", "import", "ast"],
        default="auto",
        help="auto: import, falling back to the AST read where the import fails",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--compare-ast", default="", help="comma-separated releases to also read by AST and compare"
    )
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)

    versions = args.versions.split(",") if args.versions else default_versions()
    python = cpu_python() if args.method != "ast" else None
    deps = ensure_deps(python) if python else None
    for v in versions:  # downloads first, one at a time
        ensure_source(v)
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = dict(
            zip(
                versions,
                pool.map(lambda v: extract_version(v, args.method, python, deps), versions),
                strict=True,
            )
        )
    table: dict[str, Any] = {"versions": {}}
    if args.out.exists():  # a run for some versions keeps the others
        table = json.loads(args.out.read_text())
    table["versions"].update(done)
    table["versions"] = {v: table["versions"][v] for v in sorted(table["versions"], key=_vkey)}
    for v, e in done.items():
        e["flag_count"] = len(e["flags"])
        log(
            f"{v}: {e['method']}, {len(e['flags'])} flags"
            + (f", shims {e['shims']}" if e.get("shims") else "")
        )
    cpu = "?"
    if python:
        table["calibration"] = calibrate(python, table["versions"])
        cpu = table["calibration"]["installed"]
        log(f"calibration against the installed {cpu}: {table['calibration']['result']}")
    table["source"] = SOURCE.format(cpu=cpu, deps=" ".join(EXTRA_DEPS) + " (pip --target)")
    for v in filter(None, args.compare_ast.split(",")):
        report = compare_ast(v, table["versions"][v])
        table.setdefault("ast_check", {})[v] = report
        log(f"{v}: AST vs import: {json.dumps(report)[:600]}")
    size = write_table(table, args.out)
    log(f"wrote {args.out} ({size} bytes)")
    if size > PLAIN_LIMIT:
        log("the table is over 2 MB: store it as a diff chain (not implemented; not needed so far)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
