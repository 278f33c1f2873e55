"""`clustertrain cluster`: AWS ParallelCluster config, infrastructure template and node scripts,
generated from the project file and validated offline (no AWS calls)."""

from __future__ import annotations

from pathlib import Path

import typer

from clustertrain.cli.cluster_lifecycle import register
from clustertrain.cli.cluster_options import PollOpt, ProjectArg, SetOpt, YesOpt
from clustertrain.cli.common import command_group
from clustertrain.cloud.state import project_state_path
from clustertrain.resolve import load_project

app = command_group(
    help="AWS ParallelCluster: cluster config, CloudFormation infrastructure and node scripts from the project's `aws:` section.",
)

NoSchemaOpt = typer.Option(False, "--no-schema", help="Skip aws-parallelcluster's schema check; run only clustertrain's rules.")


@app.command("config")
def config_cmd(
    project_file: Path = typer.Argument(..., help="Project file (YAML) with an `aws:` section."),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the ParallelCluster config."),
    set_: list[str] = SetOpt,
    no_schema: bool = NoSchemaOpt,
) -> None:
    """Write the ParallelCluster 3 config; nothing is written when it does not validate."""
    from clustertrain.check import require_clean
    from clustertrain.cloud import generate_cluster_config

    project = load_project(project_file, set_)
    require_clean(project, "cluster config")
    report = generate_cluster_config(project, output, use_schema=not no_schema)
    for f in report.warnings:
        typer.echo(str(f), err=True)
    if report.schema_note:
        typer.echo(f"note: {report.schema_note}", err=True)
    typer.echo(f"wrote {output} ({'schema + ' if report.schema_ran else ''}clustertrain rules: {len(report.warnings)} warning(s))")


@app.command("validate")
def validate_cmd(
    file: Path = typer.Argument(..., help="A ParallelCluster config (YAML), or a project file whose generated config is checked."),
    set_: list[str] = SetOpt,
    no_schema: bool = NoSchemaOpt,
) -> None:
    """Check a cluster config offline: aws-parallelcluster's schema (if installed) plus clustertrain's rules. Exit 2 on errors."""
    from clustertrain.cloud import validate_file

    report = validate_file(file, set_, use_schema=not no_schema)
    for f in report.findings:
        tag = "" if f.source == "clustertrain" else f" [{f.source}]"
        typer.echo(f"{f}{tag}")
    if report.schema_note:
        typer.echo(f"note: {report.schema_note}")
    checks = ("aws-parallelcluster schema + " if report.schema_ran else "") + "clustertrain rules"
    typer.echo(f"{file}: {len(report.errors)} error(s), {len(report.warnings)} warning(s) ({checks})")
    if report.errors:
        raise typer.Exit(2)


infra_app = command_group(
    help="The infrastructure stack (VPC, subnets, NAT, security groups, S3 buckets, node IAM policy): write its "
         "CloudFormation template, deploy it through a change set, show it, delete it.",
)
app.add_typer(infra_app, name="infra")


@infra_app.command("template")
def infra_template_cmd(
    project_file: Path = ProjectArg,
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the CloudFormation template."),
    set_: list[str] = SetOpt,
) -> None:
    """Write the CloudFormation template (what `infra deploy` deploys): check it with cfn-lint."""
    from clustertrain.cloud import generate_infra_template

    generate_infra_template(load_project(project_file, set_), output)
    typer.echo(f"wrote {output}; check: cfn-lint {output}; deploy: clustertrain cluster infra deploy {project_file}")


@infra_app.command("deploy")
def infra_deploy_cmd(
    project_file: Path = ProjectArg,
    set_: list[str] = SetOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="Create the change set, print it, delete it: nothing is deployed."),
    allow_replace: bool = typer.Option(False, "--allow-replace", help="Deploy a change set that replaces a bucket or the VPC."),
    poll: float = PollOpt,
) -> None:
    """Create or update the stack through a CloudFormation change set and record its outputs in PROJECT.infra.json."""
    from rich.console import Console

    from clustertrain.cloud.stack import deploy

    project = load_project(project_file, set_)
    result = deploy(project, dry_run=dry_run, allow_replace=allow_replace, echo=typer.echo,
                    console=Console(stderr=True), poll_s=poll)
    if result.state is not None:
        typer.echo(f"stack {result.stack_name}: {result.state.status}; outputs recorded in {project_state_path(project)}")
        for key, value in result.state.outputs.items():
            typer.echo(f"  {key:<24} {value}")


@infra_app.command("status")
def infra_status_cmd(project_file: Path = ProjectArg, set_: list[str] = SetOpt) -> None:
    """Show the stack, its outputs, and what a deploy of the project would change now."""
    from clustertrain.cloud.stack import inspect
    from clustertrain.cloud.state import OUTPUT_FIELDS

    project = load_project(project_file, set_)
    report = inspect(project)
    state = project.infra_state
    if report.stack is None:
        stale = f"; {project_state_path(project)} is stale (remove it)" if state is not None else ""
        typer.echo(f"stack {report.stack_name}: not deployed in {report.region}{stale}; deploy: clustertrain cluster infra deploy {project_file}")
        return
    st = report.stack
    when = st.get("LastUpdatedTime") or st.get("CreationTime")
    typer.echo(f"stack {report.stack_name} in {report.region}: {st['StackStatus']} (last change {when:%Y-%m-%d %H:%M UTC})"
               if when else f"stack {report.stack_name} in {report.region}: {st['StackStatus']}")
    for key, value in report.outputs.items():
        fills = f"  -> {OUTPUT_FIELDS[key][0]}" if key in OUTPUT_FIELDS else ""
        typer.echo(f"  {key:<24} {value}{fills}")
    if state is None:
        typer.echo(f"no state file ({project_state_path(project)}): deploy again to record the outputs")
    elif state.outputs != report.outputs:
        typer.echo(f"{project_state_path(project)} differs from the stack's outputs: deploy again to record them")
    if report.drift:
        typer.echo(f"the project differs from the deployed stack: a deploy would make {len(report.drift)} change(s):")
        for c in report.drift:
            typer.echo("  " + c.describe())
    else:
        typer.echo("the deployed stack matches the project")


@infra_app.command("delete")
def infra_delete_cmd(
    project_file: Path = ProjectArg,
    set_: list[str] = SetOpt,
    yes: bool = YesOpt,
    delete_fs: bool = typer.Option(False, "--delete-file-systems",
                                   help="Delete the stack's FSx file systems first, and their data (the stack cannot be "
                                        "deleted while they exist)."),
    poll: float = PollOpt,
) -> None:
    """Delete the stack. The S3 buckets are retained (DeletionPolicy RetainExceptOnCreate): they hold the datasets and checkpoints. The
    FSx file systems must go first (--delete-file-systems): their network interfaces hold the subnet."""
    import shlex

    from rich.console import Console

    from clustertrain.cloud.filesystems import delete_all, plan_teardown
    from clustertrain.cloud.stack import delete, inspect, retained_line

    project = load_project(project_file, set_)
    report = inspect(project)
    if report.stack is None:
        if project.infra_state is not None and project_state_path(project) is not None:
            project_state_path(project).unlink(missing_ok=True)
            typer.echo(f"removed the stale {project_state_path(project)}")
        typer.echo(f"there is no stack {report.stack_name} in {report.region}: nothing to delete")
        return
    plan = plan_teardown(report, delete_fs, shlex.join(["clustertrain", "cluster", "infra", "delete", str(project_file)]))
    typer.echo(plan.summary())
    if not yes and not typer.confirm("Delete it?", default=False):
        raise typer.Exit(1)
    if plan.file_systems:
        delete_all(plan.file_systems, report.region, echo=typer.echo, poll_s=poll)
    delete(project, report, echo=typer.echo, console=Console(stderr=True), poll_s=poll)
    typer.echo(f"deleted stack {report.stack_name}; removed {project_state_path(project)}")
    for logical, rtype, physical in plan.kept:
        typer.echo(retained_line(logical, rtype, physical))


@app.command("scripts")
def scripts_cmd(
    project_file: Path = ProjectArg,
    output: Path = typer.Option(..., "-o", "--output", help="Directory for the node scripts."),
    set_: list[str] = SetOpt,
) -> None:
    """Write the node setup scripts (head node, compute node, directory setup)."""
    from clustertrain.cloud import generate_node_scripts
    from clustertrain.cloud.scripts import upload_command

    project = load_project(project_file, set_)
    paths = generate_node_scripts(project, output)
    upload = upload_command(project, output)
    for p in paths:
        typer.echo(f"wrote {p}")
    typer.echo(f"upload before creating the cluster: {upload}")


register(app)
