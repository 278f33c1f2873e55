"""`clustertrain image build`: ``docker build`` then ``enroot import`` into the shared images directory.

Run on the head node, where ParallelCluster's AMI installs Docker and Enroot. The steps, each printed before
it runs (``--dry-run`` prints them as a script a user can paste, and runs nothing):

1. render the build context (Dockerfile, clustertrain's wheel, ``versions.json``;
   :func:`clustertrain.image.recipe.render_recipe`) into ``<work>/clustertrain-image/<tag>/``;
2. ``docker build --pull --tag NAME:TAG --file CONTEXT/Dockerfile CONTEXT``;
3. ``enroot import --output <images>/.<name>-<tag>.sqsh.partial dockerd://NAME:TAG`` with Enroot's cache,
   data and temp directories under ``<work>/enroot/`` as the compute nodes' script lays them out
   (``cloud/templates/compute-node.sh.j2``). ``enroot import`` has no ``--force`` and refuses an existing
   output, so a stale partial file is removed first;
4. verify the partial file (:func:`clustertrain.image.squashfs.verify_sqsh`: squashfs 4.0, complete,
   holds the image's interpreter), then ``os.replace`` it onto ``<images>/<name>-<tag>.sqsh``: jobs see the
   old image or the new one, never half a file (a running job keeps the inode it opened);
5. remove the build context.

``<work>`` is ``--work-dir``, else ``image.work_dir``, else ``aws.enroot.local_dir`` (the node's NVMe) when
that exists on this machine, else the system temp directory. Every refusal (images directory off the shared
file system, an existing ``.sqsh`` without ``--force``, docker or enroot missing, the Docker daemon
unreachable, the images directory not creatable, pins the compatibility table rejects, a head node root volume
too small for the build, a file system here without room for what the build writes on it) is one ImageError
line, raised before anything runs or is written; ``--dry-run`` reports the tool and directory checks as notes,
says where the bytes go (:mod:`clustertrain.image.footprint`: Docker's data root, the enroot export, the
``.sqsh``) and refuses a place without the space as a real build does.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.core.errors import ImageError
from clustertrain.image.footprint import (FreeBytes, Place, build_places, describe, docker_data_root, root_volume_problem,
                                          sizes_of, space_problem)
from clustertrain.image.paths import ImageRef, image_ref
from clustertrain.image.squashfs import verify_sqsh
from clustertrain.image.versions import check_versions, load_compat, load_versions
from clustertrain.core.storage_layout import mount_of, off_mount_problems, storage_layout, unmounted_here

if TYPE_CHECKING:
    from clustertrain.project import Project

Echo = Callable[[str], Any]
INFO_TIMEOUT_S = 60.0
HEAD_NODE_HINT = "build on the head node, where ParallelCluster's AMI installs Docker and Enroot"


@dataclass(frozen=True)
class Command:
    """One external command: its argv, the ENROOT_* variables it adds to the environment, a short label."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    what: str = ""


def format_command(cmd: Command) -> str:
    """The exact line a user can paste: ``VAR=value ... argv``, each value and word shell-quoted."""
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in cmd.env.items()] + [shlex.quote(a) for a in cmd.argv])


@dataclass(frozen=True)
class BuildPlan:
    """Where ``image build`` works and what it runs, worked out before anything happens."""

    ref: ImageRef
    context: Path    # <work>/clustertrain-image/<tag>/
    sqsh: Path       # <images>/<name>-<tag>.sqsh
    partial: Path    # <images>/.<name>-<tag>.sqsh.partial: what enroot writes
    work_dir: Path
    commands: tuple[Command, ...]  # docker build, enroot import

    @property
    def enroot_temp(self) -> Path:
        """Enroot creates its cache and data directories (enroot.in ``mkdir -p``), not its temp directory."""
        return Path(self.commands[-1].env["ENROOT_TEMP_PATH"])


@dataclass(frozen=True)
class BuildResult:
    sqsh: Path
    size_bytes: int
    commands: tuple[Command, ...]


# ----- pure parts ------------------------------------------------------------------------------------

def enroot_env(work_dir: Path, uid: int, gid: int) -> dict[str, str]:
    """Enroot's paths under ``work_dir``, laid out as the compute nodes' script writes them to enroot.conf."""
    return {"ENROOT_CACHE_PATH": f"{work_dir}/enroot/cache/group-{gid}",
            "ENROOT_DATA_PATH": f"{work_dir}/enroot/data/user-{uid}",
            "ENROOT_TEMP_PATH": f"{work_dir}/enroot/tmp"}


def docker_build_command(ref: ImageRef, context: Path) -> Command:
    return Command(argv=("docker", "build", "--pull", "--tag", ref.reference, "--file", str(context / "Dockerfile"),
                         str(context)), what="docker build")


def enroot_import_command(ref: ImageRef, partial: Path, env: dict[str, str]) -> Command:
    return Command(argv=("enroot", "import", "--output", str(partial), f"dockerd://{ref.reference}"), env=env,
                   what="enroot import")


def partial_path(sqsh: Path) -> Path:
    return sqsh.with_name(f".{sqsh.name}.partial")


def default_work_dir(project: "Project") -> Path:
    if project.image is not None and project.image.work_dir is not None:
        return Path(project.image.work_dir)
    if project.aws is not None and Path(project.aws.enroot.local_dir).is_dir():
        return Path(project.aws.enroot.local_dir)
    return Path(tempfile.gettempdir())


def plan_build(project: "Project", work_dir: Path | None = None) -> BuildPlan:
    """The paths and commands of a build; reads the project and the uid/gid of this process, touches nothing."""
    ref = image_ref(project)
    work = Path(work_dir).absolute() if work_dir is not None else default_work_dir(project)
    context = work / "clustertrain-image" / ref.tag
    partial = partial_path(ref.sqsh)
    env = enroot_env(work, os.getuid(), os.getgid())
    return BuildPlan(ref=ref, context=context, sqsh=ref.sqsh, partial=partial, work_dir=work,
                     commands=(docker_build_command(ref, context), enroot_import_command(ref, partial, env)))


def script_lines(plan: BuildPlan) -> list[str]:
    """The build as a shell script with ``#`` comments: what ``--dry-run`` prints after its notes."""
    v = load_versions(plan.ref.versions)
    docker, enroot = plan.commands
    q = shlex.quote
    return [
        f"# render the build context (Dockerfile, clustertrain's wheel, versions.json) into {plan.context}/ "
        "(`clustertrain image render PROJECT -o DIR` writes the same)",
        f"# build the docker image {plan.ref.reference} on {v.base.image}:{v.base.tag}",
        format_command(docker),
        "# import it into a squashfs file beside the final one; enroot refuses an existing output",
        f"mkdir -p -- {q(str(plan.enroot_temp))}",
        f"rm -f -- {q(str(plan.partial))}",
        format_command(enroot),
        f"# check it (squashfs 4.0, complete, holds {plan.ref.interpreter}), then rename it into place",
        f"mv -f -- {q(str(plan.partial))} {q(str(plan.sqsh))}",
        "# remove the build context",
        f"rm -rf -- {q(str(plan.context))}",
    ]


# ----- checks ----------------------------------------------------------------------------------------

def plan_places(plan: BuildPlan, docker_root: Path | None = None) -> list[Place]:
    """Where the build's bytes go (:mod:`clustertrain.image.footprint`): Docker's data root, the export, the .sqsh."""
    sizes = sizes_of(load_versions(plan.ref.versions))
    return build_places(sizes, docker_root=docker_root or docker_data_root(), enroot_temp=plan.enroot_temp,
                        images=plan.sqsh.parent)


def places_here(project: "Project", places: list[Place]) -> list[Place]:
    """The places this machine can measure: Docker's data root where docker is installed and has made it, the
    images directory where its shared file system is mounted, the export always (its nearest existing parent)."""
    out = []
    for p in places:
        if p.what == "Docker's data root" and (shutil.which("docker") is None or not p.path.is_dir()):
            continue
        if p.what == "the .sqsh" and unmounted_here(project, p.path) is not None:
            continue
        out.append(p)
    return out


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def images_off_mount(project: "Project") -> str | None:
    """Why the images directory of an aws project is not on its shared file system; None when it is (or no aws:)."""
    if project.aws is None:
        return None
    layout = storage_layout(project)
    if layout.mounts and mount_of(layout.images, layout.mounts) is not None:  # type: ignore[arg-type]
        return None
    for fld, message in off_mount_problems(project):
        if fld in ("aws.fsx", "image.dir", layout.images_origin):
            return f"{fld}: {message}"
    return f"image.dir: {layout.images} is not on a shared file system of the aws: section; set image.dir to one"


def dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot hold a new file (not a directory, not writable, cannot be created); None when it can."""
    if path.is_dir():
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable by this user"
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{path} cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{path} does not exist and cannot be created ({parent} is not writable by this user)"
    return None


def images_dir_problem(project: "Project", images: Path) -> str | None:
    """The images directory must exist or be creatable here; on a cluster, its file system must be mounted."""
    mount = unmounted_here(project, images)
    if mount is not None:
        return f"{mount} (the shared file system of {images}) is not mounted on this machine: {HEAD_NODE_HINT}"
    problem = dir_problem(images)
    return f"image.dir: {problem}" if problem else None


def missing_tool() -> str | None:
    for tool in ("docker", "enroot"):
        if shutil.which(tool) is None:
            return f"`image build` needs {tool} (not found on PATH): {HEAD_NODE_HINT}"
    return None


def docker_daemon_problem() -> str | None:
    try:
        res = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=INFO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"`docker info` did not answer in {INFO_TIMEOUT_S:.0f} s: is the Docker daemon running?"
    except OSError as e:
        return f"`docker info` cannot run: {e.strerror}"
    if res.returncode == 0:
        return None
    last = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or ["no message"])[-1].strip()
    return (f"`docker info` failed (exit {res.returncode}): {last} — start the daemon (sudo systemctl start docker) "
            "or, if permission was denied, join the docker group (sudo usermod -aG docker $USER, then log in again)")


def check_plan(project: "Project", plan: BuildPlan, *, force: bool, dry_run: bool, places: list[Place] | None = None,
               free_bytes: FreeBytes = _free_bytes) -> list[str]:
    """Raise ImageError for the first refusal; return the notes ``--dry-run`` prints instead of the
    environment checks (tools, daemon, images directory). The disk checks (the head node's root volume of an
    ``aws:`` project; free space at ``places`` measured here with ``free_bytes``) come last, in a dry run too."""
    off = images_off_mount(project)
    if off:
        raise ImageError(off)
    cfg = project.image
    assert cfg is not None  # image_ref raised otherwise
    check_versions(load_versions(cfg.versions), load_compat(), cfg.megatron, source=str(cfg.versions or "versions.yaml"))
    if plan.sqsh.exists() and not force:
        raise ImageError(f"{plan.sqsh} exists; pass --force to replace it, or change image.tag")
    if dry_run:
        notes = [missing_tool(), images_dir_problem(project, plan.sqsh.parent)]
    else:
        notes = []
        for check in (missing_tool, docker_daemon_problem, lambda: images_dir_problem(project, plan.sqsh.parent)):
            problem = check()  # in order, each only when the one before passed (no `docker info` without enroot)
            if problem:
                raise ImageError(problem)
    problem = root_volume_problem(project, export_on_root=plan.work_dir == Path(tempfile.gettempdir()))
    if problem is None:
        problem = space_problem(places_here(project, places if places is not None else plan_places(plan)), free_bytes)
    if problem:
        raise ImageError(problem)
    return [f"note: {n}" for n in notes if n]


# ----- running ---------------------------------------------------------------------------------------

def run_command(cmd: Command, echo: Echo) -> None:
    """Run ``cmd``, passing each output line to ``echo``; ImageError naming it on a non-zero exit."""
    last: deque[str] = deque(maxlen=1)
    try:
        proc = subprocess.Popen(list(cmd.argv), env={**os.environ, **cmd.env}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
    except OSError as e:
        raise ImageError(f"`{cmd.what}` cannot start: {e.strerror} ({cmd.argv[0]})") from None
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            line = line.rstrip("\n")
            echo(line)
            if line.strip():
                last.append(line.strip())
    if proc.returncode != 0:
        said = f": {last[0]}" if last else ""
        raise ImageError(f"`{cmd.what}` failed (exit {proc.returncode}){said} — the command was: {format_command(cmd)}")


def _render_default(project: "Project", out_dir: Path) -> Any:
    from clustertrain.image.recipe import render_recipe

    return render_recipe(project, out_dir)


def run_build(project: "Project", *, dry_run: bool = False, force: bool = False, work_dir: Path | None = None,
              echo: Echo = print, render: Callable[["Project", Path], Any] | None = None,
              free_bytes: FreeBytes = _free_bytes) -> BuildResult:
    """Build the project's image into its ``.sqsh`` (see the module docstring); ``dry_run``: print, run nothing.
    ``free_bytes``: the free bytes of a directory's file system (default: :func:`shutil.disk_usage`)."""
    plan = plan_build(project, work_dir)
    places = plan_places(plan)
    notes = check_plan(project, plan, force=force, dry_run=dry_run, places=places, free_bytes=free_bytes)
    if dry_run:
        echo(f"# image {plan.ref.reference} -> {plan.sqsh}")
        for n in notes:
            echo(f"# {n}")
        for line in describe(places):
            echo(line)
        for line in script_lines(plan):
            echo(line)
        return BuildResult(sqsh=plan.sqsh, size_bytes=0, commands=plan.commands)

    try:
        plan.sqsh.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ImageError(f"image.dir: cannot create {plan.sqsh.parent} ({e.strerror})") from None
    try:
        echo(f"# render the build context into {plan.context}/")
        rendered = (render or _render_default)(project, plan.context)
        for note in getattr(rendered, "notes", None) or ():
            echo(f"# note: {note}")
        if not (plan.context / "Dockerfile").is_file():
            raise ImageError(f"the build context {plan.context} has no Dockerfile after rendering")
        plan.enroot_temp.mkdir(parents=True, exist_ok=True)
        if plan.partial.exists() or plan.partial.is_symlink():
            echo(f"# removing {plan.partial} left by an earlier build (enroot refuses an existing output)")
            plan.partial.unlink()
        try:
            for cmd in plan.commands:
                echo(format_command(cmd))
                run_command(cmd, echo)
            echo(f"# checking {plan.partial}")
            verify_sqsh(plan.partial, must_contain=[plan.ref.interpreter], fix="nothing was replaced; see enroot's output "
                        f"above (a full disk under {plan.sqsh.parent} or {plan.work_dir}?) and run `image build` again")
            os.replace(plan.partial, plan.sqsh)
        except BaseException:
            plan.partial.unlink(missing_ok=True)
            raise
    finally:
        shutil.rmtree(plan.context, ignore_errors=True)
    echo(f"# renamed to {plan.sqsh}")
    return BuildResult(sqsh=plan.sqsh, size_bytes=plan.sqsh.stat().st_size, commands=plan.commands)
