"""`clustertrain export RUN_DIR|PROJECT [--model M] [--step N] -o DIR [--to URL]`: a checkpoint as a Hugging Face model
directory (:func:`clustertrain.hf.export_checkpoint`; docs/models.md "Export to Hugging Face").

Registered in :mod:`clustertrain.cli` as ``app.command("export")(export_command)``. Exit codes: 0 written, 2 bad input
(an output directory that is not empty, a step without a complete checkpoint, a run without checkpoints, an
architecture no Hugging Face class represents), nothing written then.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from clustertrain.hf.safetensors_files import HF_MAX_SHARD_SIZE


def export_command(
    target: Path = typer.Argument(
        ..., metavar="RUN_DIR|PROJECT", help="A run directory (with run.json) or a project file (the model's run "
        "directory <storage.runs or storage.root>/<project>/<model>)."),
    output: Path = typer.Option(..., "--output", "-o", help="The Hugging Face directory to write (new or empty)."),
    model: Optional[str] = typer.Option(None, "--model", help="Which model of the project (needed when it has several)."),
    step: Optional[int] = typer.Option(None, "--step", help="Export this step's checkpoint (default: the latest complete one)."),
    dtype: str = typer.Option("float32", "--dtype", help="Weights dtype: float32 (the fp32 master weights, exact) or bfloat16."),
    max_shard_size: str = typer.Option(HF_MAX_SHARD_SIZE, "--max-shard-size", help="Split the weights into files of at "
                                       "most this (decimal KB/MB/GB/TB; default: transformers' save_pretrained default)."),
    to: Optional[str] = typer.Option(None, "--to", help="Then publish the directory to this s3:// URL (or directory) "
                                     "with a checksum manifest, verified."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", help="S3-compatible endpoint for --to (default: "
                                               "the project's storage.endpoint_url, else boto3's)."),
    set_: list[str] = typer.Option([], "--set", help="Override a project field (project files only; repeatable)."),
) -> None:
    """Write a Hugging Face model directory (config.json, safetensors weights, tokenizer files, generation_config.json)
    from a run's checkpoint: LlamaForCausalLM for rope/RMSNorm/SwiGLU models, GPT2LMHeadModel for the classic ones."""
    from clustertrain.hf import export_checkpoint
    from clustertrain.storage import StoreConfig

    result = export_checkpoint(target, output, model=model, step=step, dtype=dtype, max_shard_size=max_shard_size,
                               to=to, store_options=StoreConfig(endpoint_url=endpoint_url) if endpoint_url else None,
                               overrides=set_)
    for note in result.notes:
        typer.echo(note, err=True)
    typer.echo(f"wrote {result.out}: {result.hf_class}, {result.model} step {result.step} ({result.checkpoint}), "
               f"{result.dtype}, {result.total_bytes:,} bytes of weights in {result.shards} file"
               f"{'s' if result.shards != 1 else ''}")
    if result.url:
        typer.echo(f"published to {result.url} (verified)")
