"""`clustertrain storage`: sync directories to and from object storage, verify and restore copies."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from clustertrain.cli.common import command_group

if TYPE_CHECKING:
    from clustertrain.storage import StoreConfig

app = command_group(
    help="Copy directories to and from S3 (or local directories) with a manifest; verify and restore copies. "
    "Credentials come from boto3's standard chain (env, ~/.aws, instance role).",
)
out = Console(highlight=False, soft_wrap=True)


def _options(endpoint_url: Optional[str], region: Optional[str], profile: Optional[str], part_size_mb: int) -> "StoreConfig":
    from clustertrain.storage import StoreConfig

    return StoreConfig(endpoint_url=endpoint_url, region=region, profile=profile, part_size_mb=part_size_mb)


# The options the commands share, each declared once (defaults stay in the signatures, as Annotated requires).
EndpointOpt = Annotated[Optional[str], typer.Option("--endpoint-url",
                                                    help="S3-compatible endpoint (default: AWS_ENDPOINT_URL or AWS).")]
RegionOpt = Annotated[Optional[str], typer.Option("--region", help="AWS region (default: boto3's chain).")]
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", help="AWS profile (default: boto3's chain).")]
PartOpt = Annotated[int, typer.Option("--part-size-mb", min=5,
                                      help="Multipart part size in MiB (files of 64 MiB or more go multipart).")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=1, help="Files moved at the same time.")]
PART_SIZE_MB = 8  # --part-size-mb's default
JOBS = 8  # --jobs's default


@app.command("sync")
def sync_cmd(
    src: str = typer.Argument(..., help="Source: a directory, file:///dir or s3://bucket/prefix."),
    dst: str = typer.Argument(..., help="Destination: a directory, file:///dir or s3://bucket/prefix."),
    delete: bool = typer.Option(False, "--delete", help="Remove destination objects the new manifest no longer lists."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print what would be sent and deleted."),
    jobs: JobsOpt = JOBS,
    endpoint_url: EndpointOpt = None,
    part_size_mb: PartOpt = PART_SIZE_MB,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Make DST a complete copy of SRC, moving only new or changed files; the manifest is written last."""
    from clustertrain.storage import sync

    options = _options(endpoint_url, region, profile, part_size_mb)
    result = sync(src, dst, delete=delete, dry_run=dry_run, jobs=jobs, options=options, progress=True)
    plan = result.plan
    if dry_run:
        for entry in plan.send:
            out.print(f"send    {entry.path}  ({entry.size} B)")
        for key in plan.delete:
            out.print(f"delete  {key}")
        out.print(f"dry run: would send {len(plan.send)} files ({plan.send_bytes} B), delete {len(plan.delete)}, "
                  f"keep {len(plan.unchanged)} unchanged")
    else:
        out.print(f"sent {result.transferred_files} files ({result.transferred_bytes} B), deleted {result.deleted}, "
                  f"{len(plan.unchanged)} unchanged, in {result.seconds:.1f} s"
                  + ("; manifest written" if result.manifest_written else ""))
    for key in plan.kept if delete else []:
        out.print(f"kept    {key}  (not written by clustertrain)")


@app.command("verify")
def verify_cmd(
    dst: str = typer.Argument(..., help="The copy to check: a directory, file:///dir or s3://bucket/prefix."),
    manifest: Optional[Path] = typer.Option(None, "--manifest", help="Manifest file to check against (default: DST's)."),
    full: bool = typer.Option(False, "--full", help="Download and re-hash every object."),
    jobs: JobsOpt = JOBS,
    endpoint_url: EndpointOpt = None,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Compare DST with its manifest; exit 2 when anything is missing, extra or corrupt."""
    from clustertrain.storage import verify

    options = _options(endpoint_url, region, profile, PART_SIZE_MB)
    result = verify(dst, manifest, full=full, jobs=jobs, options=options, progress=True)
    for key in result.missing:
        out.print(f"missing  {key}")
    for key in result.extra:
        out.print(f"extra    {key}")
    for key, reason in result.corrupt:
        out.print(f"corrupt  {key}: {reason}")
    mode = "full" if full else "quick"
    if result.ok:
        out.print(f"ok: {result.checked} objects match the manifest ({mode} check)")
        return
    out.print(f"MISMATCH ({mode} check): {len(result.missing)} missing, {len(result.extra)} extra, "
              f"{len(result.corrupt)} corrupt of {result.checked + len(result.missing)}")
    raise typer.Exit(2)


@app.command("restore")
def restore_cmd(
    src: str = typer.Argument(..., help="A complete copy: s3://bucket/prefix, file:///dir or a directory."),
    dst: Path = typer.Argument(..., help="Local directory to restore into."),
    jobs: JobsOpt = JOBS,
    endpoint_url: EndpointOpt = None,
    part_size_mb: PartOpt = PART_SIZE_MB,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Download the copy at SRC into DST; every file is hash-checked before it is moved into place."""
    from clustertrain.storage import restore_directory

    options = _options(endpoint_url, region, profile, part_size_mb)
    result = restore_directory(src, dst, jobs=jobs, options=options, progress=True)
    out.print(f"restored {result.transferred_files} files ({result.transferred_bytes} B), "
              f"{len(result.plan.unchanged)} already present, in {result.seconds:.1f} s")
