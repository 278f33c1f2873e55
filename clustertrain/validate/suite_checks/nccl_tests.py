"""Check ``nccl-tests``: NVIDIA's nccl-tests binaries from the project's image, over every rank of the job.

One job over ``cluster.ranks_per_node`` tasks per node, one step per collective of the sweep (``ops``), in the
image through Pyxis (:func:`~clustertrain.validate.suitejob.in_image`: training's options, mounts and
environment) with ``--mpi=pmix`` (the binaries are built with MPI, ``MPI=1``, in the image's recipe)::

    srun --nodes=N --ntasks-per-node=G --kill-on-bad-exit=1 --mpi=pmix --container-image=IMAGE ... \\
        all_reduce_perf -b MIN -e MAX -f FACTOR -g 1 -c 1 -n ITERS -w WARMUP

as awsome-distributed-training runs them (``micro-benchmarks/nccl-tests/slurm/nccl-tests-container.sbatch``,
commit 01b6b78: ``srun --container-image ... --mpi=pmix ... all_reduce_perf -b 8 -e 16G -f 2 -g 1 -c 1 -n 100``);
the binaries are on the image's ``PATH`` (``/opt/nccl-tests/build``, ``image/templates/Dockerfile.j2``). The
sweep is the collectives check's (sizes, factor, iterations). Each op's output lands in ``<op>.txt``; NCCL's INFO
log (:data:`~clustertrain.validate.suite_checks.collectives.NCCL_DEBUG_ENV`) in ``nccl-*.log``.

Judged: per op, the parsed output (:func:`~clustertrain.validate.nccltests.parse_nccl_tests`) is complete with no
wrong result, over nodes x ranks per node ranks; the bandwidth bands of the thresholds entry
(:func:`~clustertrain.validate.thresholds.bandwidth_rows`); the transport rows. Not applicable without GPUs or
without a container image (the binaries are the image's).
"""

from __future__ import annotations

from dataclasses import replace


from clustertrain.validate.check_rows import CheckRow
from clustertrain.validate.nccltests import parse_nccl_tests
from clustertrain.validate.results import CollectiveRun
from clustertrain.validate.suite_checks.collectives import NCCL_DEBUG_ENV, job_config
from clustertrain.validate.suitedir import JobOutcome, read_text
from clustertrain.validate.suitejob import SuiteContext, SuiteJob, in_image, job_env, new_job, srun_step, why_missing
from clustertrain.validate.thresholds import bandwidth_rows
from clustertrain.validate.transport import transport_rows

NAME = "nccl-tests"


def not_applicable(ctx: SuiteContext) -> str | None:
    if not ctx.project.cluster.gpus_per_node:
        return f"not applicable: gpus_per_node={ctx.project.cluster.gpus_per_node}"
    if not ctx.project.container_image:
        return "not applicable: no container image (the nccl-tests binaries are the image's)"
    return None


def command(op: str, spec) -> list[str]:
    """The nccl-tests argv of one op (``-g 1``: one GPU per task; ``-c 1``: check every result)."""
    return [f"{op}_perf", "-b", str(spec.min_bytes), "-e", str(spec.max_bytes), "-f", str(spec.factor), "-g", "1",
            "-c", "1", "-n", str(spec.iters), "-w", str(spec.warmup)]


def plan(ctx: SuiteContext) -> list[SuiteJob]:
    n, res, per_node = ctx.cfg.nodes, ctx.paths.results(NAME), ctx.project.cluster.ranks_per_node
    spec, _ = job_config(ctx)
    base = job_env(ctx, n)
    env = replace(base, set={**base.set, **NCCL_DEBUG_ENV})  # keeps the node-side rules (GLOO_SOCKET_IFNAME)
    box, env = in_image(ctx, env, res)
    return [new_job(ctx, NAME, NAME, nodes=n, ntasks_per_node=per_node, env=env,
                    steps=[srun_step(ctx, n, per_node, res, f"{op}.txt", ("--kill-on-bad-exit=1", "--mpi=pmix", *box.srun))
                           + box.command(command(op, spec)) for op in spec.ops],
                    outputs=[res / f"{op}.txt" for op in spec.ops])]


def gather(job: SuiteJob, outcome: JobOutcome, nodes: list[str], ctx: SuiteContext) -> list[CheckRow]:
    texts = [read_text(o) for o in job.outputs]
    logs = [read_text(p) or "" for p in sorted(job.results_dir.glob("nccl-*.log"))] + [t or "" for t in texts]
    rows = evaluate_nccl_tests(job, texts, ctx)
    missing = next((r for r in rows if r.found == "no output"), None)
    if missing is not None:  # srun's or Pyxis' own words (an image without the binaries, no PMIx...)
        missing.detail = f"{missing.detail}; {why_missing(job, outcome)}"
    return rows + transport_rows(logs, backend="nccl", efa_expected=job.env.efa,
                                 instance_type=ctx.project.cluster.instance_type, job=NAME)


def evaluate_nccl_tests(job: SuiteJob, texts: list[str | None], ctx: SuiteContext) -> list[CheckRow]:
    """Per op: complete, no wrong result, every rank; then the bandwidth bands over all ops."""
    ranks = job.nodes * job.ntasks_per_node
    merged = CollectiveRun(tool="nccl-tests")
    rows = []
    for out, text in zip(job.outputs, texts):
        op = out.stem
        if not text or not text.strip():
            rows.append(CheckRow(job=NAME, check=op, verdict="fail", found="no output", threshold=f"{ranks} ranks, "
                                 "complete, 0 wrong", detail=f"{out.name} is empty or missing"))
            continue
        run = parse_nccl_tests(text)
        reports = [r for r in run.reports if r.rows or r.problems]
        merged.reports += [r for r in reports if r.op == op]
        wrong = sum((r.wrong or 0) + (r.inplace_wrong or 0) for rep in reports for r in rep.rows)
        problems = [p for rep in reports for p in rep.problems]
        if run.world_size not in (None, ranks):
            problems.append(f"{run.world_size} rank(s), not {ranks}")
        rows.append(CheckRow(job=NAME, check=op, verdict="fail" if problems or not reports else "pass",
                             found=f"{sum(len(r.rows) for r in reports)} size(s), {wrong} wrong, "
                                   f"{run.world_size or '?'} rank(s)",
                             threshold=f"{ranks} ranks, complete, 0 wrong", detail="; ".join(problems)[:300]))
    return rows + bandwidth_rows(merged, job.nodes, ctx.table, ctx.key, job=NAME)
