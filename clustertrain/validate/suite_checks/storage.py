"""Check ``storage-K``: throughput and metadata rates of every place the project's jobs write.

One single-node job per target (:func:`storage_targets`): ``clustertrain validate storage DIR --config
SUITE/config/storage.json --json`` into ``storage.json``; the config file is the run's
:class:`~clustertrain.validate.storagebench.StorageBenchConfig`. ``DIR`` (:func:`bench_dir`) is, on a shared mount,
the project's own directory there (the storage layout's ``bench_dir``, which the node scripts create with the
project's owner): a mount's root is root-owned 0755 on a real file system, so nothing is written there. A project
without shared mounts benchmarks its runs base itself. With a container image the step runs in it through Pyxis
(:func:`~clustertrain.validate.suitejob.in_image`) with the image's interpreter, as training's I/O does.

Judged: the bench ran cleanly; on an FSx mount, write and read >= ``min(tier x capacity, client_cap) x min_fraction`` (thresholds.yaml ``fsx``); a read
that may have come from the page cache is ``warn``.
"""

from __future__ import annotations

from pathlib import Path

from clustertrain.core.storage_layout import mount_of, storage_layout
from clustertrain.project import Project
from clustertrain.validate.check_rows import CheckRow
from clustertrain.validate.results import StorageRun
from clustertrain.validate.suitedir import JobOutcome, load_result
from clustertrain.launch.presets import RankEnvironment
from clustertrain.validate.suitejob import SuiteContext, SuiteJob, in_image, job_env, new_job, srun_step, why_missing
from clustertrain.validate.thresholds import ThresholdsConfig

NAME = "storage"


def storage_targets(project: Project) -> list[Path]:
    """Where the project's jobs write: without shared mounts, the run directories' base (``storage.runs``, else
    ``storage.root``); with them, the mounts holding the storage layout's bases, then each aws.fsx mount dir (once
    each). A base off every mount is not benchmarked (it would measure a node's root volume):
    ``validation_base`` and ``clustertrain check`` refuse such a project."""
    layout = storage_layout(project)
    if not layout.mounts:
        return [layout.runs]
    held = [mount_of(b, layout.mounts) for b in layout.bases().values()]
    targets = [Path(m) for m in held if m] + [Path(f.mount_dir) for f in (project.aws.fsx if project.aws else [])]
    return list(dict.fromkeys(targets))


def bench_dir(project: Project, target: Path) -> Path:
    """Where the bench writes on ``target``: the layout's project directory on a shared mount, else ``target``."""
    layout = storage_layout(project)
    return layout.bench_dir(target) if layout.mounts else target


def not_applicable(ctx: SuiteContext) -> str | None:
    return None


def plan(ctx: SuiteContext) -> list[SuiteJob]:
    config = ctx.paths.config(NAME)
    text = ctx.cfg.storage.model_dump_json(indent=2) + "\n"
    jobs = []
    for k, target in enumerate(storage_targets(ctx.project), 1):
        name, res, where = f"{NAME}-{k}", ctx.paths.results(f"{NAME}-{k}"), bench_dir(ctx.project, target)
        env = job_env(ctx, 1) if ctx.project.container_image else RankEnvironment()
        box, env = in_image(ctx, env, res, (where,))
        jobs.append(new_job(ctx, name, NAME, nodes=1, ntasks_per_node=1, gpus=False, target=str(where), env=env,
                            steps=[srun_step(ctx, 1, None, res, "storage.json", box.srun) + box.command([
                                str(ctx.cfg.python), "-m", "clustertrain", "validate", "storage", str(where),
                                "--config", str(config), "--json"])],
                            outputs=[res / "storage.json"], files=((config, text),)))
    return jobs


def gather(job: SuiteJob, outcome: JobOutcome, nodes: list[str], ctx: SuiteContext) -> list[CheckRow]:
    run = load_result(StorageRun, job.outputs[0])
    if run is None:
        return [CheckRow(job=job.name, check=f"bench {job.target}", verdict="fail", found="no JSON result",
                         threshold="the bench writes its report", detail=why_missing(job, outcome))]
    return evaluate_storage(job.name, ctx.project, run, ctx.table)


def evaluate_storage(job: str, project: Project, run: StorageRun, table: ThresholdsConfig) -> list[CheckRow]:
    """Bench ran cleanly; on an FSx mount, throughput >= the FSx rule (thresholds.yaml ``fsx``)."""
    rows = []
    for res in run.results:
        fsx = next((f for f in (project.aws.fsx if project.aws else [])
                    if Path(res.target).is_relative_to(f.mount_dir)), None)
        need, thr = None, "measured, no error"
        if fsx is not None and fsx.effective_throughput:
            baseline = fsx.effective_throughput * fsx.capacity_gb / 1024 * 1e6 / (1 << 20)  # MB/s/TiB x TiB -> MiB/s
            need = min(baseline, table.fsx.client_cap_mib_s) * table.fsx.min_fraction
            thr = f">= {need:.0f} MiB/s ({fsx.name}: {fsx.effective_throughput} MB/s/TiB x {fsx.capacity_gb} GiB)"
        for what, val in (("write", res.write_mib_s), ("read", res.read_mib_s)):
            verdict = "fail" if val is None else ("fail" if need is not None and val < need else "pass")
            cached = what == "read" and res.cache_bypass == "none"
            rows.append(CheckRow(job=job, check=f"{what} {res.target}", verdict="warn" if cached and verdict == "pass"
                                 else verdict, found="-" if val is None else f"{val:.0f} MiB/s", threshold=thr,
                                 detail=f"{res.tool}, page cache: {res.cache_bypass or 'not recorded'}" + (
                                     " (read may come from memory)" if cached else "")))
        md = [res.create_per_s, res.stat_per_s, res.unlink_per_s]
        rows.append(CheckRow(job=job, check=f"metadata {res.target}", verdict="fail" if None in md else "pass",
                             found="-" if None in md else "create {:.0f}/s, stat {:.0f}/s, unlink {:.0f}/s".format(*md),
                             threshold="measured"))
    if run.problems or not run.results:
        rows.append(CheckRow(job=job, check="bench", verdict="fail", found="; ".join(run.problems)[:300] or "no result",
                             threshold="no error"))
    for w in run.warnings:
        rows.append(CheckRow(job=job, check="bench", verdict="pass", found=w[:200], detail="note"))
    return rows
