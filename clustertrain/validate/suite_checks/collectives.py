"""Check ``collectives``: every rank joins, every collective gives exact results in time, at the bandwidth
of the thresholds entry, over the network the instance type should use.

One job over ``cluster.ranks_per_node`` tasks per node: ``srun --kill-on-bad-exit=1 python -m clustertrain
validate collectives --json --config SUITE/config/collectives.json`` (rank 0's report into
``collectives-0.json``). The config file is the :class:`~clustertrain.validate.collectives.CollectivesConfig`
of the run with the backend (NCCL on GPUs, gloo on CPU) and the largest size filled in. The job gets the
project's NCCL/EFA rank environment; on CPU ``OMP_NUM_THREADS=1`` unless set; on NCCL also ``NCCL_DEBUG=INFO``
(:data:`NCCL_DEBUG_ENV`: ``nccl-<host>-<pid>.log`` in the results directory), from which the transport
verdict is read (:mod:`clustertrain.validate.transport`). With a container image the step runs in it through
Pyxis (:func:`~clustertrain.validate.suitejob.in_image`: training's options, mounts and ``--container-env``) with
the image's interpreter, so it measures the image's torch, NCCL and aws-ofi-nccl. The rehearsal fault
``absent:R`` is not passed to the benchmark: a wrapper keeps rank R's task from starting at all.

Judged: ranks = nodes x ranks per node; per op, exact results within the per-op timeout; busbw bands of the
thresholds entry (:func:`~clustertrain.validate.thresholds.bandwidth_rows`); the transport rows.
"""

from __future__ import annotations

from dataclasses import replace

import re

from clustertrain.launch.presets import rank_environment
from clustertrain.project import Project
from clustertrain.validate.check_rows import CheckRow
from clustertrain.validate.collectives_config import CollectivesConfig
from clustertrain.validate.results import CollectiveRun
from clustertrain.validate.suitedir import JobOutcome, load_result, read_text
from clustertrain.validate.suitejob import SuiteContext, SuiteJob, in_image, new_job, srun_step, why_missing
from clustertrain.validate.thresholds import ThresholdsConfig, bandwidth_rows, default_max_bytes, thresholds_key
from clustertrain.validate.transport import transport_rows

NAME = "collectives"
_ABSENT = re.compile(r"^absent:(\d+)$")
#: set on the NCCL collectives job, over the project's own values: what the transport verdict reads
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": "nccl-%h-%p.log"}
#: rank R never starts; the others run the benchmark (argv after the wrapper: R, then the command)
WITHHOLD = 'if [ "$SLURM_PROCID" = "$0" ]; then echo "rank $0 withheld (fault absent:$0)" >&2; exit 0; fi; exec "$@"'


def default_collectives(project: Project, table: ThresholdsConfig) -> CollectivesConfig:
    """The suite's default sweep for ``project`` (see :func:`~clustertrain.validate.thresholds.default_max_bytes`)."""
    cl = project.cluster
    return CollectivesConfig(iters=10, max_bytes=default_max_bytes(
        table, thresholds_key(table, cl.instance_type, cl.gpus_per_node), cl.gpus_per_node))


def job_config(ctx: SuiteContext) -> tuple[CollectivesConfig, str | None]:
    """What the job's config file holds (backend and largest size resolved, an ``absent:`` fault taken out), and
    the rank to withhold (``absent:R``), if any."""
    c = ctx.cfg.collectives or default_collectives(ctx.project, ctx.table)
    backend = c.backend or ("nccl" if ctx.project.cluster.gpus_per_node else "gloo")
    absent = _ABSENT.match(c.fault or "")
    spec = CollectivesConfig.model_validate({**c.model_dump(), "backend": backend, "max_bytes": c.top(backend),
                                             "fault": None if absent else c.fault})
    return spec, absent.group(1) if absent else None


def not_applicable(ctx: SuiteContext) -> str | None:
    return None


def plan(ctx: SuiteContext) -> list[SuiteJob]:
    project, n, res = ctx.project, ctx.cfg.nodes, ctx.paths.results(NAME)
    cl = project.cluster
    spec, withheld = job_config(ctx)
    config = ctx.paths.config(NAME)
    args = [str(ctx.cfg.python), "-m", "clustertrain", "validate", "collectives", "--json", "--config", str(config)]
    if withheld is not None:  # rehearsal: that rank's task exits before it joins
        args = ["bash", "-c", WITHHOLD, withheld, *args]
    env = rank_environment(cl.instance_type, n, project.launch, os=project.aws.os if project.aws else None,
                           container=bool(ctx.project.container_image))
    extra = dict(NCCL_DEBUG_ENV) if spec.backend == "nccl" else {}  # relative: the script runs in the results dir
    if not cl.gpus_per_node:
        extra["OMP_NUM_THREADS"] = env.set.get("OMP_NUM_THREADS", "1")
    env = replace(env, set={**env.set, **extra})  # keeps the node-side rules (GLOO_SOCKET_IFNAME)
    box, env = in_image(ctx, env, res)
    return [new_job(ctx, NAME, NAME, nodes=n, ntasks_per_node=cl.ranks_per_node, env=env,
                    steps=[srun_step(ctx, n, cl.ranks_per_node, res, "collectives-%t.json",
                                     ("--kill-on-bad-exit=1", *box.srun)) + box.command(args)],
                    outputs=[res / "collectives-0.json"], files=((config, spec.model_dump_json(indent=2) + "\n"),))]


def gather(job: SuiteJob, outcome: JobOutcome, nodes: list[str], ctx: SuiteContext) -> list[CheckRow]:
    run = load_result(CollectiveRun, job.outputs[0])
    if run is None:
        return [CheckRow(job=job.name, check="result", verdict="fail", found="no JSON result",
                         threshold="rank 0 writes its report", detail=why_missing(job, outcome))]
    logs = [read_text(p) or "" for p in sorted(job.results_dir.glob("nccl-*.log"))
            + sorted(job.results_dir.glob("collectives-*.err"))]
    timeout_s = ctx.cfg.collectives.timeout_s if ctx.cfg.collectives else 60.0
    return evaluate_collectives(run, job.nodes * job.ntasks_per_node, job.nodes, ctx.table, ctx.key, timeout_s) + \
        transport_rows(logs, backend=run.backend, efa_expected=job.env.efa, instance_type=ctx.project.cluster.instance_type)


def evaluate_collectives(run: CollectiveRun, expected_ranks: int, nodes: int, table: ThresholdsConfig,
                         key: str, timeout_s: float) -> list[CheckRow]:
    """Ranks, per-op correctness (and completion within the per-op timeout), busbw bands of ``key``."""
    rows = [CheckRow(job=NAME, check="ranks", verdict="pass" if run.world_size == expected_ranks else "fail",
                     found=str(run.world_size), threshold=f"{expected_ranks} ranks", detail=run.backend or "")]
    op_problems = {p for rep in run.reports for p in rep.problems}
    general = [p for p in run.problems if not any(p.endswith(q) for q in op_problems)]
    if general:
        rows.append(CheckRow(job=NAME, check="run", verdict="fail", found="; ".join(general)[:300],
                             threshold=f"every rank joins and reports within {timeout_s:g}s"))
    for rep in run.reports:
        wrong = sum(r.wrong or 0 for r in rep.rows)
        rows.append(CheckRow(job=NAME, check=f"{rep.op} correctness", verdict="fail" if rep.failed else "pass",
                             found=f"{len(rep.rows)} size(s), {wrong} wrong", threshold=f"exact results, each op < {timeout_s:g}s",
                             detail="; ".join(rep.problems)[:300]))
    return rows + bandwidth_rows(run, nodes, table, key)
