"""`clustertrain data`: tokenize corpora into Megatron indexed datasets, validate them, train tokenizers."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from clustertrain.cli.common import command_group

app = command_group(help="Prepare tokenized datasets (Megatron .bin/.idx + manifest), validate them, train BPE tokenizers "
                         "and make their directory loadable by Megatron-LM.")
out = Console(highlight=False, soft_wrap=True)


@app.command("prepare")
def prepare_cmd(
    inputs: List[str] = typer.Option(..., "--input", "-i", help="Input files or globs (.txt, .jsonl, .jsonl.gz); repeat for several."),
    output_prefix: Path = typer.Option(..., "--output-prefix", "-o", help="Writes PREFIX.bin, PREFIX.idx, PREFIX.manifest.json."),
    json_key: str = typer.Option("text", "--json-key", help="JSONL key holding each document's text."),
    tokenizer: str = typer.Option("byte", "--tokenizer", help="'byte', hf:PATH or a path to a tokenizer.json."),
    workers: int = typer.Option(1, "--workers", "-w", min=1, help="Tokenizer processes."),
    append_eod: bool = typer.Option(True, "--append-eod/--no-append-eod", help="End every document with the eod token."),
    skip_bad_lines: bool = typer.Option(False, "--skip-bad-lines", help="Skip (and count) bad JSONL lines instead of stopping."),
    publish: Optional[str] = typer.Option(None, "--publish", help="Then copy the dataset to this s3:// URL (or directory), verified."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", help="S3-compatible endpoint for --publish."),
    encoder: str = typer.Option("auto", "--encoder", help="auto: gigatoken where it gives the same tokens as the "
                                "tokenizer.json's own encoder (checked at start), else its own; reference: always its "
                                "own. The output is the same either way."),
) -> None:
    """Tokenize INPUTS into a Megatron indexed dataset (does nothing when it is already up to date)."""
    from clustertrain.data import prepare_dataset

    err = Console(stderr=True)
    # In a log (stderr not a terminal) the bar's one final line is kept until preparation succeeds, so that a
    # failure prints its error line alone.
    bar = err if err.is_terminal else Console(file=io.StringIO(), width=err.width)
    result = prepare_dataset(inputs, output_prefix, tokenizer, json_key=json_key, workers=workers,
                             append_eod=append_eod, skip_bad_lines=skip_bad_lines, console=bar,
                             encoder=encoder)
    if bar is not err:
        sys.stderr.write(bar.file.getvalue())
    if publish:
        from clustertrain.data.staging import publish_dataset
        from clustertrain.storage import StoreConfig

        publish_dataset(output_prefix, publish, StoreConfig(endpoint_url=endpoint_url))
    m = result.manifest
    state = "up to date, nothing done" if result.reused else "written"
    out.print(f"{output_prefix}: {state} — {m['documents']:,} documents, {m['tokens']:,} tokens ({m['dtype']}, "
              f"tokenizer {m['tokenizer']})")
    if result.skipped_lines:
        out.print(f"skipped {result.skipped_lines:,} bad lines; first: {m['first_skipped'][0]}")
    if publish:
        out.print(f"published to {publish} (verified)")


@app.command("validate")
def validate_cmd(
    prefix: str = typer.Argument(..., help="Dataset prefix (PREFIX.idx / PREFIX.bin)."),
    full: bool = typer.Option(False, "--full", help="Check every token and hash the whole .bin, however large."),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="Token ids must be below this (default: the manifest's)."),
) -> None:
    """Check header, index, data size, token range and manifest checksums; exit 2 on any problem."""
    from clustertrain.data import validate_dataset

    report = validate_dataset(prefix, vocab_size=vocab_size, full=full)
    for note in report.notes:
        out.print(f"note: {note}")
    if not report.ok:
        for problem in report.problems:
            print(f"error: {prefix}: {problem}", file=sys.stderr)
        raise typer.Exit(2)
    out.print(f"{prefix}: ok — {report.documents:,} documents, {report.sequences:,} sequences, {report.tokens:,} tokens")


@app.command("train-tokenizer")
def train_tokenizer_cmd(
    inputs: List[str] = typer.Option(..., "--input", "-i", help="Training text: files or globs (.txt, .jsonl, .jsonl.gz)."),
    vocab_size: int = typer.Option(..., "--vocab-size", help="Vocabulary size, specials included (>= 258)."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write tokenizer.json."),
    json_key: str = typer.Option("text", "--json-key", help="JSONL key holding each document's text."),
) -> None:
    """Train a byte-level BPE tokenizer (eod = <|endoftext|>) and write tokenizer.json."""
    from clustertrain.data import train_tokenizer
    from clustertrain.data.vocab import vocab_limit

    tok = train_tokenizer(inputs, vocab_size, output, json_key=json_key)
    out.print(f"{output}: {tok.vocab_size:,} tokens, eod {tok.eod}, identity {tok.identity}")
    if output.name == "tokenizer.json":
        out.print(f"{output.with_name('tokenizer_config.json')}: written too (Megatron-LM loads {output.parent} with it)")
    else:
        out.print(f"note: Megatron-LM (framework: megatron) loads a directory's tokenizer.json: rename {output} to "
                  f"{output.with_name('tokenizer.json')} and run `clustertrain data tokenizer-config` on it")
    if tok.vocab_size < vocab_size:
        out.print(f"note: asked for {vocab_size:,}, reached {tok.vocab_size:,} (every word of the input is already one "
                  f"token); a model using it needs model.vocab between {tok.vocab_size:,} and "
                  f"{vocab_limit(tok.vocab_size):,}, or unset — or train on more text")


@app.command("tokenizer-config")
def tokenizer_config_cmd(
    tokenizer_json: Path = typer.Argument(..., metavar="TOKENIZER_JSON",
                                          help="A tokenizer.json (or the directory holding it)."),
) -> None:
    """Write tokenizer_config.json beside TOKENIZER_JSON so that Megatron-LM (--tokenizer-type HuggingFaceTokenizer,
    transformers' AutoTokenizer) loads its directory with our end-of-document token; never overwrites a different one."""
    from clustertrain.data.tokenizers import HFTokenizer, write_tokenizer_config
    from clustertrain.core.errors import ConfigError

    path = Path(str(tokenizer_json).removeprefix("hf:"))
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; give the path of a tokenizer.json (train one with "
                          "`clustertrain data train-tokenizer`)")
    existed = path.with_name("tokenizer_config.json").exists()
    written = write_tokenizer_config(path)
    tok = HFTokenizer(path)
    state = "already up to date, nothing done" if existed else "written"
    out.print(f"{written}: {state} — PreTrainedTokenizerFast, eos/bos {tok.eod_token} (id {tok.eod}), "
              f"{tok.vocab_size:,} tokens; Megatron-LM loads {path.parent} (--tokenizer-model)")
