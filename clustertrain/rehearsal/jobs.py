"""Each model's job in a rehearsal: the batch script ``submit`` would send, with only the rank command swapped.

:func:`rehearsal_job` builds the model's :class:`~clustertrain.launch.sbatch.SbatchRequest` exactly as
``clustertrain submit`` does (:func:`~clustertrain.launch.sbatch.build_request`: the preset, the GPU directive,
the plan's node count, Pyxis flags), then

* swaps the rank command for the payload (:mod:`clustertrain.rehearsal.payload`, run by this machine's
  interpreter: the image's is not here);
* runs it the way Pyxis would, in the stand-in view (:mod:`clustertrain.launch.container_view`: Pyxis is absent,
  and srun refuses options no plugin registered), given the same ``--container-*`` options plus the rehearsal's
  own directory (where the payload keeps its records); the checks also see them: the image and every
  ``--container-mounts`` source must be visible on every node.

:func:`submit_on_head` is what runs on the emulated head node (``python -m clustertrain.rehearsal.jobs
SUBMIT``): the data a user stages there before submitting (the tokenizer, the image) as placeholder files where
they are absent, the run directory and its ``config.yaml``, then the scripts through
:meth:`~clustertrain.launch.slurm.SlurmLauncher.submit_request` — the same calls ``submit`` makes. The requests
travel as a pickle in the rehearsal's own directory (mode 0700, written and read by this user only).
"""

from __future__ import annotations

import json
import pickle
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.rehearsal.observed import JobView
from clustertrain.launch.sbatch import SbatchRequest, build_request, render_script, with_container_view
from clustertrain.plan.packing import job_share

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project

RUN_KINDS = ("run", "logs", "checkpoints", "tensorboard")


@dataclass
class RehearsalJob:
    view: JobView
    request: SbatchRequest         # what the rehearsal submits (payload, in the container view)
    script: str                    # its rendered text (a test hook may have edited it)
    spec: dict                     # the payload's job spec
    placeholders: list[str]        # files staged on the head node before submitting
    config_text: str               # the run directory's config.yaml


def rehearsal_job(project: "Project", entry: "ModelEntry", nodes: int, rdir: Path, secret_name_re: str,
                  secret_value_re: str, hold_s: float, rendezvous_s: float) -> RehearsalJob:
    from clustertrain.launch.prepare import default_run_dir
    from clustertrain.core.storage_layout import mount_of, storage_layout
    from clustertrain.project import dump_project
    from clustertrain.core.run_paths import RunPaths

    layout = storage_layout(project)
    run_dir = default_run_dir(project, entry)
    real = build_request(project, entry, run_dir, nodes=nodes, submit_command="clustertrain rehearse PROJECT")
    spec_path = rdir / "jobs" / f"{entry.name}.json"
    payload = (sys.executable, "-m", "clustertrain.rehearsal.payload", str(spec_path))
    if real.container_image:  # the ranks in the stand-in for Pyxis: the real options, and the rehearsal's own records
        request = with_container_view(replace(real, rank_command=payload,
                                              container_mounts=(*real.container_mounts, f"{rdir}:{rdir}")))
    else:
        request = replace(real, rank_command=payload)
    paths = RunPaths(run_dir)
    dirs = {"run": str(run_dir), "logs": str(real.log_dir), "checkpoints": str(paths.checkpoints)}
    tb = layout.tensorboard_dir(entry.name)
    if tb is not None:
        dirs["tensorboard"] = str(tb)
    write_dirs = [dirs["run"], dirs["logs"]] + ([dirs["tensorboard"]] if tb is not None else [])
    placeholders: list[str] = []
    tokenizer = entry.data.tokenizer
    if tokenizer != "byte" and not tokenizer.startswith(("hf:", "builtin:")):
        placeholders.append(tokenizer)
    if real.container_image and real.container_image.startswith("/"):
        placeholders.append(real.container_image)
    # every mount source must exist on every node (Pyxis cannot bind a missing one)
    mounts = [m.split(":", 1)[0] for m in real.container_mounts]
    read = list(dict.fromkeys([*placeholders, str(layout.datasets), *mounts]))
    shared = layout.mounts
    off = [f"{d} ({kind})" for kind, d in dirs.items() if mount_of(d, shared) is None]
    container = {}
    if real.container_image:
        container = {"image": real.container_image, "mounts": list(real.container_mounts), "env": list(real.container_env),
                     "workdir": str(real.run_dir), "interpreter": real.python}
    spec = {"model": entry.name, "records": str(rdir / "records" / entry.name), "holding": str(rdir / "holding" / entry.name),
            "release": str(rdir / "release"), "hold_s": hold_s, "rendezvous_s": rendezvous_s, "write": write_dirs,
            "read": read, "expect_env": sorted(real.env.set), "secret_name_re": secret_name_re,
            "secret_value_re": secret_value_re}
    share = job_share(project, entry)  # a share of one node: its own GPUs, --mem, CPUs (the request has them)
    view = JobView(model=entry.name, planned_nodes=real.nodes, gpus_per_node=real.gpus_per_node,
                   ranks_per_node=real.ntasks_per_node, partition=project.cluster.partition,
                   expect_env=dict(real.env.set), write_dirs=write_dirs, read_paths=read, dirs=dirs, off_shared=off,
                   container=container, share=asdict(share) if share is not None else {})
    return RehearsalJob(view, request, render_script(request), spec, placeholders, dump_project(project))


def write_submission(jobs: list[RehearsalJob], path: Path) -> None:
    """The head node's part, for :func:`submit_on_head` (see the module docstring)."""
    from clustertrain.core.run_paths import write_atomic

    items = [{"model": j.view.model, "request": j.request, "script": j.script, "placeholders": j.placeholders,
              "config": j.config_text} for j in jobs]
    write_atomic(path, pickle.dumps(items), mode=0o600)


def submit_on_head(path: Path) -> dict[str, dict]:
    """Stage, prepare and submit every job of the submission file; model -> {"job_id"} or {"error"}."""
    from clustertrain.core.errors import ClusterTrainError
    from clustertrain.launch.slurm import SlurmLauncher
    from clustertrain.core.run_paths import RunPaths, write_atomic

    items = pickle.loads(path.read_bytes())
    launcher = SlurmLauncher()
    out: dict[str, dict] = {}
    for item in items:
        request: SbatchRequest = item["request"]
        try:
            for placeholder in item["placeholders"]:
                p = Path(placeholder)
                if not p.exists():
                    p.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(p, "clustertrain rehearse: placeholder for the file staged here before a real run\n")
            paths = RunPaths(request.run_dir)
            paths.root.mkdir(parents=True, exist_ok=True)
            paths.logs.mkdir(exist_ok=True)
            write_atomic(paths.config, item["config"])
            out[item["model"]] = {"job_id": launcher.submit_request(paths, request, item["script"])}
        except (ClusterTrainError, OSError) as err:
            out[item["model"]] = {"error": str(err)}
    return out


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m clustertrain.rehearsal.jobs SUBMISSION")
    print(json.dumps(submit_on_head(Path(argv[0]))))


if __name__ == "__main__":
    main(sys.argv[1:])
