"""`clustertrain validate ...`: environment scans, collectives and storage benchmarks, log parsing."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer
from pydantic import ValidationError

from clustertrain.cli.common import command_group
from clustertrain.core.errors import ClusterTrainError

app = command_group("Validate a cluster: environment scans, NCCL/gloo collectives, storage, benchmark logs.")


def _option_error(err: ValidationError, error: type[ClusterTrainError],
                  options: dict[str, str] | None = None) -> ClusterTrainError:
    """A model built from options failed: one line naming the option (``--max-bytes: ...``); ``options`` maps a
    field to its option where the names differ."""
    first = err.errors()[0]
    field = str(first["loc"][-1]) if first["loc"] else ""
    option = (options or {}).get(field, field.replace("_", "-"))
    return error(f"--{option}: {first['msg'].removeprefix('Value error, ')}")


def _refuse_with_config(ctx: typer.Context, config: Path | None, options: tuple[str, ...]) -> None:
    """``--config FILE`` holds the whole spec: an option of it given too is a mistake, not silently ignored."""
    sources = {o: ctx.get_parameter_source(o) for o in options}  # typer's own click: compare by the enum's name
    given = [o for o, src in sources.items() if src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")]
    if config is not None and given:
        from clustertrain.validate import ValidateError

        raise ValidateError(f"--config {config}: the file holds the whole spec; drop --{given[0].replace('_', '-')} "
                            "(or drop --config and give options)")


@app.command()
def scan(
    role: Annotated[str, typer.Option(help="Node role: head, compute or container.")],
    instance_type: Annotated[str | None, typer.Option(help="Instance type (default: read from DMI).")] = None,
    requirements: Annotated[Path | None, typer.Option(help="Requirements YAML (default: the bundled table).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check this node against the requirements table; exit 1 when a check fails."""
    from clustertrain.validate import load_requirements, scan as do_scan, scan_table

    report = do_scan(role, instance_type, load_requirements(requirements))
    typer.echo(report.model_dump_json(indent=2) if json_out else scan_table(report))
    raise typer.Exit(1 if report.failed else 0)


COLLECTIVES_OPTIONS = ("ops", "min_bytes", "max_bytes", "factor", "iters", "warmup", "nproc", "timeout", "backend", "fault")


@app.command()
def collectives(
    ctx: typer.Context,
    ops: Annotated[str, typer.Option(help="Comma-separated collectives.")] = "all_reduce,all_gather,broadcast,reduce,reduce_scatter,alltoall",
    min_bytes: Annotated[str, typer.Option(help="Smallest size: 8, 1K, 4M, 4G.")] = "8",
    max_bytes: Annotated[str | None, typer.Option(
        help="Largest size: 8, 1K, 4M, 4G (default: 1G on NCCL/GPU, where bandwidth bands apply; 1M on gloo/CPU).")] = None,
    factor: Annotated[int, typer.Option(help="Size multiplier.")] = 2,
    iters: Annotated[int, typer.Option(help="Timed iterations per size.")] = 20,
    warmup: Annotated[int, typer.Option(help="Warm-up iterations per size.")] = 5,
    nproc: Annotated[int, typer.Option(help="Local processes when not inside a distributed job.")] = 2,
    timeout: Annotated[float, typer.Option(help="Per-operation timeout, seconds.")] = 60.0,
    backend: Annotated[str | None, typer.Option(help="nccl or gloo (default: nccl if CUDA).")] = None,
    fault: Annotated[str | None, typer.Option(help="Self-test fault: hang|corrupt|exit:RANK:OP or absent:RANK.")] = None,
    config: Annotated[Path | None, typer.Option(help="The whole spec as a YAML/JSON file (CollectivesConfig keys: ops, "
                                                     "min_bytes, max_bytes, ...), instead of the options above.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    csv_file: Annotated[Path | None, typer.Option("--csv", help="Also write CSV rows to this file.")] = None,
) -> None:
    """Benchmark collectives with correctness checks; exit 1 when any op fails or hangs."""
    from clustertrain.core.run_paths import write_atomic
    from clustertrain.core.schema import load_yaml_model
    from clustertrain.validate import (
        CollectivesConfig, ValidateError, collectives_csv, collectives_table, job_env, parse_size, run_collectives,
    )

    _refuse_with_config(ctx, config, COLLECTIVES_OPTIONS)
    if config is not None:
        spec = load_yaml_model(config, CollectivesConfig, error=ValidateError)
    else:
        try:
            spec = CollectivesConfig(ops=[o.strip() for o in ops.split(",") if o.strip()], min_bytes=parse_size(min_bytes),
                                     max_bytes=parse_size(max_bytes) if max_bytes else None, factor=factor, iters=iters,
                                     warmup=warmup, timeout_s=timeout, backend=backend, nproc=nproc, fault=fault)
        except ValidationError as e:
            raise _option_error(e, ValidateError, {"timeout_s": "timeout"}) from None
    run = run_collectives(spec)
    env = job_env()
    if env is None or env.rank == 0:
        typer.echo(run.model_dump_json(indent=2) if json_out else collectives_table(run))
        if csv_file:
            write_atomic(csv_file, collectives_csv(run))
    sys.stdout.flush()
    code = 1 if run.failed else 0
    if env is not None:
        os._exit(code)  # a wedged process group must not hang the exit of a rank
    raise typer.Exit(code)


@app.command()
def parse(
    file: Annotated[Path, typer.Argument(help="nccl-tests / IOR / mdtest log, or fio JSON.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    expect_efa: Annotated[bool, typer.Option("--expect-efa", help="nccl-tests log of an EFA cluster: fail unless every "
                                             "process used aws-ofi-nccl with provider efa (NCCL_DEBUG=INFO).")] = False,
    instance_type: Annotated[str | None, typer.Option(help="With --expect-efa: also check the aws-ofi-nccl version "
                                                      "against this type's minimum (requirements.yaml).")] = None,
) -> None:
    """Parse a benchmark log (tool detected from the content); exit 1 when it shows a failure."""
    from clustertrain.validate import collectives_table, parse_output_file, storage_table, transport_rows

    run = parse_output_file(file)
    if expect_efa and run.kind == "collectives":
        for row in transport_rows([file.read_text(errors="replace")], backend="nccl", efa_expected=True,
                                  instance_type=instance_type):
            if row.verdict == "fail":
                run.problems.append(f"{row.check}: {row.found}; {row.detail}")
                run.failed = True
    if json_out:
        typer.echo(run.model_dump_json(indent=2))
    else:
        typer.echo(collectives_table(run) if run.kind == "collectives" else storage_table(run))
    raise typer.Exit(1 if run.failed else 0)


Engine = Literal["auto", "fio", "python"]  # clustertrain.validate.storagebench.StorageBenchConfig.engine
Cache = Literal["auto", "direct", "drop", "buffered"]  # StorageBenchConfig.cache


@app.command()
def storage(
    ctx: typer.Context,
    paths: Annotated[list[Path], typer.Argument(help="Directories on the mounts to benchmark.")],
    size: Annotated[str, typer.Option(help="Data written then read per path: 64M, 1G...")] = "256M",
    files: Annotated[int, typer.Option(help="Files for the metadata rates.")] = 1000,
    engine: Annotated[Engine, typer.Option(help="auto (fio if installed), fio or python.")] = "auto",
    cache: Annotated[Cache, typer.Option(help="Keep the page cache out: auto (O_DIRECT, else drop caches, else a file "
                                            "larger than RAM, else none), direct, drop or buffered.")] = "auto",
    config: Annotated[Path | None, typer.Option(help="The whole spec as a YAML/JSON file (StorageBenchConfig keys: "
                                                     "size_mib, files, engine, cache, ...), instead of the options above.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Sequential write/read throughput and create/stat/unlink rates per path; exit 1 on failure."""
    from clustertrain.core.schema import load_yaml_model
    from clustertrain.validate import StorageBenchConfig, ValidateError, parse_size, run_storage_bench, storage_table

    _refuse_with_config(ctx, config, ("size", "files", "engine", "cache"))
    if config is not None:
        cfg = load_yaml_model(config, StorageBenchConfig, error=ValidateError)
    else:
        cfg = StorageBenchConfig(size_mib=max(parse_size(size) // (1024 * 1024), 1), files=files, engine=engine,
                                 cache=cache)  # type: ignore[arg-type]
    run = run_storage_bench(list(paths), cfg)
    typer.echo(run.model_dump_json(indent=2) if json_out else storage_table(run))
    raise typer.Exit(1 if run.failed else 0)


#: suite option of each SuiteConfig / CollectivesConfig / StorageBenchConfig field, for error lines
SUITE_OPTIONS = {"job_timeout_s": "timeout", "start_timeout_s": "start-timeout", "timeout_s": "op-timeout",
                 "fault": "inject-fault", "size_mib": "storage-size", "files": "storage-files"}


@app.command()
def suite(
    project_file: Annotated[Path, typer.Argument(metavar="PROJECT", help="Project file (cluster, storage, launch).")],
    nodes: Annotated[str, typer.Option(help="Nodes per multi-node job: a count (2, 10) or 'all' (the partition).")] = "2",
    timeout: Annotated[float, typer.Option(help="Per-job limit once running, seconds; then cancelled = fail.")] = 600.0,
    start_timeout: Annotated[float, typer.Option(help="Per-job limit while pending, seconds.")] = 600.0,
    ops: Annotated[str, typer.Option(help="Collectives, comma-separated.")] = "all_reduce,all_gather,broadcast,reduce,reduce_scatter,alltoall",
    min_bytes: Annotated[str, typer.Option(help="Smallest collective size.")] = "8",
    max_bytes: Annotated[str | None, typer.Option(
        help="Largest collective size (default: up to the bandwidth bands, >= 1G, on GPUs; 1M on CPU).")] = None,
    iters: Annotated[int, typer.Option(help="Timed iterations per size.")] = 10,
    warmup: Annotated[int, typer.Option(help="Warm-up iterations per size.")] = 5,
    op_timeout: Annotated[float, typer.Option(help="Per-operation (and rendezvous) timeout of the collectives, s.")] = 60.0,
    storage_size: Annotated[str, typer.Option(help="Data written then read per mount: 64M, 1G...")] = "256M",
    storage_files: Annotated[int, typer.Option(help="Files for the metadata rates.")] = 1000,
    engine: Annotated[Engine, typer.Option(help="Storage engine: auto, fio or python.")] = "auto",
    thresholds: Annotated[Path | None, typer.Option(help="Thresholds YAML (default: the bundled table).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a project key: KEY=VALUE.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the config files and batch scripts; submit nothing.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    inject_fault: Annotated[str | None, typer.Option(hidden=True, help="Rehearsal only: collectives fault, e.g. absent:1.")] = None,
) -> None:
    """Run smoke, GPU/EFA, collectives and storage checks as Slurm jobs; one report; exit 1 when a check fails."""
    from clustertrain.check import require_clean
    from clustertrain.launch.batch import partition_nodes
    from clustertrain.resolve import load_project
    from clustertrain.validate import CollectivesConfig, StorageBenchConfig, ValidateError, parse_size
    from clustertrain.validate import suite as s

    project = load_project(project_file, set_ or [])
    if not dry_run:  # the preflight first: nothing is planned, written or submitted for a project it refuses
        require_clean(project, "validate suite")
    table = s.load_thresholds(thresholds)
    cl = project.cluster
    top = parse_size(max_bytes) if max_bytes else s.default_max_bytes(
        table, s.thresholds_key(table, cl.instance_type, cl.gpus_per_node), cl.gpus_per_node, parse_size(min_bytes))
    count = s.resolve_nodes(nodes, project, partition_nodes(cl.partition))
    try:
        cfg = s.SuiteConfig(
            nodes=count, job_timeout_s=timeout, start_timeout_s=start_timeout,
            collectives=CollectivesConfig(ops=[o.strip() for o in ops.split(",") if o.strip()],
                                          min_bytes=parse_size(min_bytes), max_bytes=top,
                                          iters=iters, warmup=warmup, timeout_s=op_timeout, fault=inject_fault),
            storage=StorageBenchConfig(size_mib=max(parse_size(storage_size) // (1 << 20), 1), files=storage_files,
                                       engine=engine))  # type: ignore[arg-type]
    except ValidationError as e:
        raise _option_error(e, ValidateError, SUITE_OPTIONS) from None
    cfg.collectives.sizes()  # type: ignore[union-attr]
    if dry_run:
        paths = s.SuitePaths(s.validation_base(project) / "DRY-RUN")
        jobs, skipped = s.plan_suite(project, cfg, paths, table)
        for path, text in dict(f for job in jobs for f in job.files).items():
            typer.echo(f"# ---- config: {path}\n{text}")
        for job in jobs:
            typer.echo(f"# ---- {job.name}: {paths.script(job.name)}\n{s.render_job(job, paths)}")
        for name, reason in skipped.items():
            typer.echo(f"# ---- {name}: {reason}")
        require_clean(project, "validate suite")  # a dry run shows the scripts, then whether they would be refused
        raise typer.Exit(0)
    report = s.run_suite(project, cfg, thresholds=table)
    if json_out:
        typer.echo(report.model_dump_json(indent=2))
    else:
        from rich.console import Console

        console = Console(width=160)
        console.print(s.suite_table(report))
        console.print(f"verdict: {'FAILED' if report.failed else 'OK'}; report: {Path(report.directory) / 'report.json'}",
                      markup=False, highlight=False)
    raise typer.Exit(1 if report.failed else 0)
