"""`clustertrain cluster`: AWS ParallelCluster config, infrastructure template and node scripts,
generated from the project file and validated offline (no AWS calls)."""

from __future__ import annotations

from pathlib import Path

import typer

from clustertrain.cli.common import command_group
from clustertrain.project import load_project

app = command_group(
    help="AWS ParallelCluster: cluster config, CloudFormation infrastructure and node scripts from the project's `aws:` section.",
)

SetOpt = typer.Option([], "--set", help="Override a project field (dotted key=value).")
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


@app.command("infra")
def infra_cmd(
    project_file: Path = typer.Argument(..., help="Project file (YAML) with an `aws:` section."),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the CloudFormation template."),
    set_: list[str] = SetOpt,
) -> None:
    """Write the CloudFormation template: VPC, subnets, NAT, security groups, S3 buckets, compute IAM policy."""
    from clustertrain.cloud import generate_infra_template

    generate_infra_template(load_project(project_file, set_), output)
    typer.echo(f"wrote {output}; check: cfn-lint {output}; deploy: aws cloudformation deploy --template-file {output} "
               "--stack-name NAME --capabilities CAPABILITY_IAM")


@app.command("scripts")
def scripts_cmd(
    project_file: Path = typer.Argument(..., help="Project file (YAML) with an `aws:` section."),
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
