"""The image's recipe: a Dockerfile rendered from the pins, and the build context ``image build`` hands docker.

``clustertrain image render PROJECT -o DIR`` writes DIR as a whole (built in ``.DIR.tmp-<pid>`` beside it,
then renamed into place; an existing DIR is replaced only when it is empty or an earlier render):

=====================  ===================================================================================
file                   what it holds
=====================  ===================================================================================
``Dockerfile``         ``templates/Dockerfile.j2`` rendered from the pins (:func:`dockerfile_text`)
``<wheel>``            clustertrain's own wheel (``clustertrain-<version>-py3-none-any.whl``), built from
                       the source tree clustertrain runs from
``requirements.txt``   the pins' ``python:`` section, one ``name==version`` per line
``versions.json``      what the image holds (:func:`versions_json_text`), copied to
                       ``/opt/clustertrain/versions.json`` in the image
``.dockerignore``      ``*``, then ``!`` each file the Dockerfile copies
=====================  ===================================================================================

``versions.json`` (pretty JSON, ``format: 1``)::

    {"format": 1, "image": "<name>:<tag>", "base": "<image>:<tag>", "clustertrain": "<version>",
     "megatron": bool, "interpreter": "/opt/clustertrain/venv/bin/python", "pins_file": "<path>",
     "components": {name: {version, source, date, from}},   # clustertrain.image.versions.resolved
     "notes": ["..."]}                                        # clustertrain.image.versions.compat_notes

In the image, ``/opt/clustertrain/`` also holds ``pip-freeze.txt`` (every package the interpreter sees),
``base-constraints.txt`` (the base's torch and numpy, which pip may not replace), the wheel and
``requirements.txt``. What the Dockerfile installs and why is said in its own comments.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from clustertrain import __version__
from clustertrain.core.errors import ImageError
from clustertrain.image.config import NAME_RE, TAG_RE
from clustertrain.image.paths import image_config, image_ref
from clustertrain.image.versions import (DEFAULT_VERSIONS, Pin, VersionsFile, check_versions, compat_notes, load_compat,
                                         load_versions, resolved, vtuple)
from clustertrain.core.templating import environment

if TYPE_CHECKING:
    from clustertrain.project import Project

TEMPLATES = Path(__file__).parent / "templates"
#: where each pin that the recipe builds from source is cloned from
REPOS = {
    "gdrcopy": "https://github.com/NVIDIA/gdrcopy.git",
    "nccl": "https://github.com/NVIDIA/nccl.git",
    "nccl_tests": "https://github.com/NVIDIA/nccl-tests.git",
    "megatron_lm": "https://github.com/NVIDIA/Megatron-LM.git",
}
#: removed before the EFA installer runs (research: awsome-distributed-training's Megatron-LM Dockerfile)
FIGHTS_EFA_PACKAGES = ("ibverbs-utils", "libibverbs-dev", "libibverbs1", "libmlx5-1")
FIGHTS_EFA_PATHS = ("/opt/hpcx/ompi", "/opt/hpcx/nccl_rdma_sharp_plugin", "/usr/local/mpi", "/opt/amazon/aws-ofi-nccl")
#: where the EFA installer's aws-ofi-nccl may land (aws-ofi-nccl contrib/debian-template/rules: libnccl-ofi and
#: libnccl-ofi-ngc-v3 in /opt/amazon/ofi-nccl/lib, ngc-v1/v2 in /opt/amazon/aws-ofi-nccl/lib; the Amazon Linux RPM
#: in /opt/amazon/ofi-nccl/lib64, shared/facts.md): the recipe registers the one holding the plugin with the loader
PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/amazon/aws-ofi-nccl/lib")
PLUGIN_CONF = "/etc/ld.so.conf.d/000_clustertrain-ofi-nccl.conf"
GDRCOPY_CONF = "/etc/ld.so.conf.d/000_clustertrain-gdrcopy.conf"
#: aws-ofi-nccl names its NCCL plugin libnccl-net-ofi.so from v1.17.0 (src/Makefile.am; libnccl-net.so only with
#: --enable-nccl-net-library since), libnccl-net.so before
PLUGIN_RENAMED_IN = (1, 17, 0)
MEGATRON_DATASETS = "/opt/megatron-lm/megatron/core/datasets"
#: p5 / p5e are H100 / H200 (sm_90): what NCCL and nccl-tests are compiled for (their defaults build ~6 targets)
GENCODE = "-gencode=arch=compute_90,code=sm_90"
#: the base's packages pip must keep exactly as they are in the image's clustertrain environment
BASE_KEPT = ("torch", "numpy")
CLUSTERTRAIN_DIR = "/opt/clustertrain"
DOCKERFILE = "Dockerfile"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_WHEEL_RE = re.compile(r"^[A-Za-z0-9_.+-]+\.whl$")
_PATH_RE = re.compile(r"^/[A-Za-z0-9_./+-]+$")
_COMMIT_RE = re.compile(r"\bcommit ([0-9a-f]{7,40})\b")


@dataclass(frozen=True)
class Rendered:
    """A written build context (module docstring)."""

    dir: Path
    dockerfile: Path
    wheel: Path
    versions_json: Path
    reference: str
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Source:
    """A pin built from its git repository: the tag to clone and the commit it must be, when its source names one."""

    version: str
    tag: str
    commit: str | None
    requirement: str = ""


def git_tag(version: str) -> str:
    """The git tag of a pinned version: ``2.30.4-1`` -> ``v2.30.4-1``; ``v2.5.1`` and ``core_v0.16.1`` as written."""
    return f"v{version}" if version[:1].isdigit() else version


def pinned_commit(pin: Pin) -> str | None:
    """The commit a pin's source names (``... (commit 55ac7082...)``), or None."""
    m = _COMMIT_RE.search(pin.source)
    return m.group(1) if m else None


def _source(pin: Pin, requirement: str = "") -> Source:
    return Source(version=pin.version, tag=git_tag(pin.version), commit=pinned_commit(pin), requirement=requirement)


def clone_command(url: str, tag_var: str, dest: str, commit: str | None) -> str:
    """``git clone`` of the tag held by build ARG ``tag_var``; with ``commit``, fail unless HEAD starts with it."""
    q = shlex.quote
    cmd = f'git clone --depth 1 --branch "${{{tag_var}}}" {q(url)} {q(dest)}'
    if commit:
        why = q(f"{dest}: not the pinned commit {commit}")
        cmd += f' \\\n && case "$(git -C {q(dest)} rev-parse HEAD)" in {commit}*) ;; *) echo {why} >&2; exit 1;; esac'
    return cmd


def plugin_library(aws_ofi_nccl: str) -> tuple[str, str | None]:
    """The NCCL net plugin file of an aws-ofi-nccl version and the ``NCCL_NET_PLUGIN`` that loads it by name
    (None: NCCL's default name, libnccl-net.so)."""
    return ("libnccl-net-ofi.so", "ofi") if vtuple(aws_ofi_nccl) >= PLUGIN_RENAMED_IN else ("libnccl-net.so", None)


def require_library_command(lib: str, why: str) -> str:
    """Fail the RUN unless ``ldconfig -p`` lists ``lib``, saying why on stderr (awk reads all of its input: no
    SIGPIPE under pipefail, and no ``a && b || c`` chain)."""
    q = shlex.quote
    return (f"ldconfig -p | awk -v lib={q(lib)} -v msg={q(f'the loader does not list {lib}: {why}')} \\\n"
            "    '$1 == lib {found = 1} END {if (!found) {print msg > \"/dev/stderr\"; exit 1}}'")


def venv_of(interpreter: str) -> str:
    """The venv of the image's interpreter: ``/opt/clustertrain/venv/bin/python`` -> ``/opt/clustertrain/venv``."""
    return str(PurePosixPath(interpreter).parent.parent)


def validate_pins(v: VersionsFile, source: str) -> None:
    """What the recipe puts into Dockerfile syntax and shell beyond :mod:`versions`' own checks; one-line ImageError."""
    if not NAME_RE.match(v.base.image):
        raise ImageError(f"{source}: base.image {v.base.image!r} is not a docker image name (e.g. nvcr.io/nvidia/pytorch)")
    if not TAG_RE.match(v.base.tag):
        raise ImageError(f"{source}: base.tag {v.base.tag!r} is not a docker tag (e.g. 26.02-py3)")
    interp = PurePosixPath(v.interpreter)
    if not _PATH_RE.match(v.interpreter) or interp.parent.name != "bin" or ".." in interp.parts:
        raise ImageError(f"{source}: interpreter {v.interpreter!r} must be an absolute path <venv>/bin/<python> "
                         "(e.g. /opt/clustertrain/venv/bin/python)")
    for section, names in (("base.provides", v.base.provides), ("pins", v.pins), ("python", v.python), ("tracking", v.tracking)):
        for name in names:
            if not _NAME_RE.match(name):
                raise ImageError(f"{source}: {section}: name {name!r} must be letters, digits, '.', '_' or '-'")


def _components(v: VersionsFile, megatron: bool) -> list[dict[str, str]]:
    out = []
    for name, row in resolved(v, megatron).items():
        if not name.startswith("python:"):
            out.append({"name": name, "version": str(row["version"]), "origin": str(row["from"])})
    return out


def _constraints_code() -> str:
    names = ", ".join(json.dumps(n) for n in BASE_KEPT)
    return ("import importlib.metadata as m; "
            f'print(*(f"{{d}}=={{m.version(d)}}" for d in [{names}]), sep=chr(10))')


def dockerfile_text(versions: VersionsFile, *, megatron: bool, wheel_name: str, clustertrain_version: str,
                    pins_file: str | None = None, reference: str | None = None, notes: list[str] | tuple[str, ...] = ()) -> str:
    """The Dockerfile for ``versions`` (pure: no wheel, no files). ImageError on a pin that cannot go into it."""
    source = pins_file or str(DEFAULT_VERSIONS)
    validate_pins(versions, source)
    if not _WHEEL_RE.match(wheel_name):
        raise ImageError(f"wheel {wheel_name!r}: a wheel file name is letters, digits, '_', '.', '+', '-' and ends in .whl")
    need = ["efa_installer", "gdrcopy", "nccl_tests"] + (["megatron_lm"] if megatron else [])
    for name in need:
        if name not in versions.pins:
            raise ImageError(f"{source}: pins.{name}: missing; the recipe installs it at the pinned version "
                             "(add it with a source)")
    pins = versions.pins
    mega = _source(pins["megatron_lm"], "megatron-core @ file:///opt/megatron-lm") if megatron else None
    venv = venv_of(versions.interpreter)
    plugin = versions.component("aws_ofi_nccl")
    plugin_lib, plugin_env = plugin_library(plugin.version if plugin else "1.22.0")
    return environment(TEMPLATES).get_template("Dockerfile.j2").render(
        clustertrain_version=clustertrain_version,
        pins_file=" ".join(source.split()),
        reference=reference,
        components=_components(versions, megatron),
        notes=[" ".join(n.split()) for n in notes],
        base_image=versions.base.image,
        base_tag=versions.base.tag,
        efa_installer=pins["efa_installer"].version,
        gdrcopy=_source(pins["gdrcopy"]),
        nccl_tests=_source(pins["nccl_tests"]),
        nccl=_source(pins["nccl"]) if "nccl" in pins else None,
        megatron=mega,
        repos=REPOS,
        clone=clone_command,
        fights_efa_packages=FIGHTS_EFA_PACKAGES,
        fights_efa_paths=FIGHTS_EFA_PATHS,
        plugin_dirs=PLUGIN_DIRS,
        plugin_conf=PLUGIN_CONF,
        plugin_lib=plugin_lib,
        plugin_env=plugin_env,
        gdrcopy_conf=GDRCOPY_CONF,
        require=require_library_command,
        megatron_datasets=MEGATRON_DATASETS,
        gencode=GENCODE,
        base_kept=BASE_KEPT,
        clustertrain_dir=CLUSTERTRAIN_DIR,
        venv=venv,
        readable=[CLUSTERTRAIN_DIR] + ([] if venv.startswith(CLUSTERTRAIN_DIR + "/") else [venv]),
        interpreter=versions.interpreter,
        constraints_code=_constraints_code(),
        constraints=f"{CLUSTERTRAIN_DIR}/base-constraints.txt",
        requirements=f"{CLUSTERTRAIN_DIR}/requirements.txt",
        freeze=f"{CLUSTERTRAIN_DIR}/pip-freeze.txt",
        wheel_name=wheel_name,
        wheel_path=f"{CLUSTERTRAIN_DIR}/{wheel_name}",
    )


def requirements_text(versions: VersionsFile) -> str:
    """The ``python:`` and ``tracking:`` pins (the trackers' clients: always installed, so that turning
    ``monitor.trackers`` on needs no new image), ``name==version`` per line."""
    pins = {**versions.python, **versions.tracking}
    return "".join(f"{name}=={pin.version}\n" for name, pin in pins.items())


def dockerignore_text(wheel_name: str) -> str:
    """Everything out of the build context but what the Dockerfile copies."""
    return "".join(f"{line}\n" for line in ("*", "!requirements.txt", "!versions.json", f"!{wheel_name}"))


def versions_json_text(versions: VersionsFile, *, reference: str, megatron: bool, notes: list[str], pins_file: str) -> str:
    """``versions.json`` (module docstring)."""
    doc = {
        "format": 1,
        "image": reference,
        "base": f"{versions.base.image}:{versions.base.tag}",
        "clustertrain": __version__,
        "megatron": megatron,
        "interpreter": versions.interpreter,
        "pins_file": pins_file,
        "components": resolved(versions, megatron),
        "notes": list(notes),
    }
    return json.dumps(doc, indent=2) + "\n"


def source_root() -> Path:
    """The source tree clustertrain runs from (the directory with its pyproject.toml), to build its wheel."""
    import clustertrain

    root = Path(clustertrain.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    try:
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        name = None
    if name != "clustertrain":
        raise ImageError(f"clustertrain runs from {root.parent}, not from its source tree (no pyproject.toml of clustertrain "
                         "above the package): install it from a checkout (pip install -e .), or pass a wheel you built")
    return root


def build_wheel(dest: Path) -> Path:
    """Build clustertrain's wheel from :func:`source_root` into ``dest`` (pip wheel, no dependencies); its path.

    It builds from a copy of the package and its project files in a temp directory: setuptools' in-tree
    ``build/lib`` keeps modules deleted since the last build, and would put them into the wheel."""
    root = source_root()
    with tempfile.TemporaryDirectory(prefix="clustertrain-wheel-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(root / "clustertrain", src / "clustertrain", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for f in root.iterdir():
            if f.is_file() and (f.name == "pyproject.toml" or f.name.startswith(("README", "LICENSE", "LICENCE"))):
                shutil.copyfile(f, src / f.name)
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(src)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise ImageError(f"building clustertrain's wheel from {root} took over 600 s (pip wheel); "
                             "run it by hand to see why") from None
    wheels = sorted(dest.glob("clustertrain-*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        lines = [ln.strip() for ln in (done.stderr + "\n" + done.stdout).splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit {done.returncode}, {len(wheels)} wheels written"
        raise ImageError(f"building clustertrain's wheel from {root} failed (pip wheel): {last}")
    return wheels[0]


def _is_previous_render(d: Path) -> bool:
    names = {p.name for p in d.iterdir()}
    return not names or {DOCKERFILE, "versions.json"} <= names


def _replace_dir(staged: Path, out_dir: Path) -> None:
    """Move ``staged`` to ``out_dir``; an existing ``out_dir`` is renamed away first and removed after."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(out_dir, old)
    try:
        os.rename(staged, out_dir)
    except OSError:
        if old is not None:
            os.rename(old, out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def render_recipe(project: "Project", out_dir: Path, *, wheel: Path | None = None) -> Rendered:
    """Write the build context of ``project``'s image into ``out_dir`` (module docstring). Bad pins, a directory
    that is not an earlier render, or a wheel that cannot be built: ImageError, and nothing is written."""
    ref = image_ref(project)
    cfg = image_config(project)
    pins_file = str(cfg.versions or DEFAULT_VERSIONS)
    versions = load_versions(cfg.versions)
    table = load_compat()
    check_versions(versions, table, cfg.megatron, pins_file)
    notes = compat_notes(versions, table)
    dockerfile_text(versions, megatron=cfg.megatron, wheel_name="clustertrain.whl", clustertrain_version=__version__,
                    pins_file=pins_file)  # every check before anything is written
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and (not out_dir.is_dir() or not _is_previous_render(out_dir)):
        raise ImageError(f"{out_dir}: exists and is not an earlier `clustertrain image render` output (no Dockerfile and "
                         "versions.json); pass another --output or remove it")
    if wheel is not None and (not Path(wheel).is_file() or not _WHEEL_RE.match(Path(wheel).name)):
        raise ImageError(f"{wheel}: not a wheel file (*.whl); build one with `pip wheel --no-deps .`")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staged = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        if wheel is None:
            whl = build_wheel(staged)
        else:
            whl = staged / Path(wheel).name
            shutil.copyfile(wheel, whl)
        files = {
            DOCKERFILE: dockerfile_text(versions, megatron=cfg.megatron, wheel_name=whl.name, clustertrain_version=__version__,
                                        pins_file=pins_file, reference=ref.reference, notes=notes),
            "requirements.txt": requirements_text(versions),
            "versions.json": versions_json_text(versions, reference=ref.reference, megatron=cfg.megatron, notes=notes,
                                                pins_file=pins_file),
            ".dockerignore": dockerignore_text(whl.name),
        }
        for name, text in files.items():
            (staged / name).write_text(text)
        for p in staged.iterdir():
            p.chmod(0o644)
        _replace_dir(staged, out_dir)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return Rendered(dir=out_dir, dockerfile=out_dir / DOCKERFILE, wheel=out_dir / whl.name,
                    versions_json=out_dir / "versions.json", reference=ref.reference, notes=tuple(notes))
