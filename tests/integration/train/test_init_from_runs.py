"""``training.init_from`` through real ``clustertrain run``s: a random ``LlamaForCausalLM`` that ``transformers`` made
and saved (tests/unit/train/test_init_from.py ``make_hf_dir``) is the starting point of a run in one process, with
tp 2 with pp 2 and with FSDP2 over 2 ranks (2 gloo ranks each); the run's first-step loss (its metrics.jsonl) equals the HF model's own loss
on the run's first batch, which is read back from the run directory with the ranks' own ``open_samples``. The weights
are far from a fresh model's (std 0.3), so a loss near ln(vocab) — the ranks' own initialisation — would fail the
comparison. A second run of the one-process case resumes from its own checkpoint, not from the HF weights."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from clustertrain.core.run_paths import RunPaths
from clustertrain.resolve import load_project
from clustertrain.train.feed import open_samples

from tests.support.training import metrics, run_cli
from tests.unit.train.test_init_from import TINY, example_with, hf_loss, make_hf_dir

pytestmark = pytest.mark.slow

PROJECT = """
name: initfrom
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: {procs}, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
  - name: tiny
    model: {model}
    data: {{source: "builtin:shakespeare", tokenizer: {tokenizer}}}
    training: {{max_steps: 1, micro_batch: 2, global_batch: 4, lr: 1.0e-2, warmup_steps: 0, checkpoint_every: 1,
               log_every: 1, seed: 11, init_from: {init_from}, async_checkpoint: false}}
    parallelism: {parallelism}
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """HF directories and one storage root for the module (the corpus is tokenized with the HF tokenizer once)."""
    root = tmp_path_factory.mktemp("init-from")
    return {"root": root, "untied": make_hf_dir(root / "hf-untied"), "tied": make_hf_dir(root / "hf-tied", tied=True, seed=3)}


def _project(shared, where: Path, hf: str, procs: int, parallelism: dict) -> Path:
    directory = shared[hf]
    path = where / "p.yaml"
    path.write_text(textwrap.dedent(PROJECT.format(
        procs=procs, root=json.dumps(str(shared["root"] / "fsx")), model=json.dumps({**TINY, "seq_len": 32,
                                                                                     "tie_embeddings": hf == "tied"}),
        tokenizer=json.dumps(str(directory / "tokenizer.json")), init_from=json.dumps(str(directory)),
        parallelism=json.dumps(parallelism))))
    return path


def _first_step(shared, tmp_path, hf: str, procs: int, parallelism: dict, project: Path | None = None
                ) -> tuple[Path, Path, str]:
    project = project or _project(shared, tmp_path, hf, procs, parallelism)
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stdout
    assert f"weights: init_from {shared[hf]} (LlamaForCausalLM, " in res.stdout, res.stdout
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1]
    # the run's first batch, read back from its directory as the ranks read it (run.json's dataset, the seed)
    samples, vocab = open_samples(RunPaths(run_dir), load_project(project).models[0])
    assert vocab == 320
    import torch

    batch = torch.from_numpy(samples.batch(0, 4).astype("int64"))
    expected = hf_loss(shared[hf], batch)
    assert abs(expected - math.log(320)) > 0.5  # not what a fresh model gives: the comparison can fail
    assert rows[0]["loss"] == pytest.approx(expected, abs=2e-5), (rows[0]["loss"], expected)
    return project, run_dir, res.stdout


def test_one_process_starts_from_the_hf_weights_and_resumes_from_its_own_checkpoint(shared, tmp_path):
    project, run_dir, _ = _first_step(shared, tmp_path, "untied", 1, {})
    assert (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("step_*"))
    res = run_cli("run", str(project), "--run-dir", str(run_dir), "--set", "models.tiny.training.max_steps=2")
    assert res.returncode == 0, res.stdout
    assert "resumed from" in res.stdout and "weights: init_from" not in res.stdout, res.stdout
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    # step 2 trains the step-1 weights: had the HF weights been loaded again, its loss would be the HF model's
    samples, _ = open_samples(RunPaths(run_dir), load_project(project).models[0])
    import torch

    untouched = hf_loss(shared["untied"], torch.from_numpy(samples.batch(4, 4).astype("int64")))
    assert abs(rows[1]["loss"] - untouched) > 1e-3, (rows[1]["loss"], untouched)


def test_tensor_parallel_ranks_read_their_slices_of_a_tied_model(shared, tmp_path):
    _first_step(shared, tmp_path, "tied", 2, {"tp": 2, "zero_stage": 3})


def test_fsdp2_ranks_read_their_row_shards(shared, tmp_path):
    _first_step(shared, tmp_path, "untied", 2, {"zero_stage": 3})


def test_pipeline_stages_read_their_own_blocks(shared, tmp_path):
    _first_step(shared, tmp_path, "untied", 2, {"pp": 2})


def test_the_continue_example_with_a_tiny_directory_of_the_same_family_trains_from_its_weights(shared, tmp_path):
    """examples/continue-smollm2.yaml (2 data-parallel ranks, tied embeddings) with the published model replaced by
    the tiny tied Llama (no network here: tests/unit/train/test_init_from.py ``example_with``), one step."""
    project = example_with(tmp_path, shared["tied"], max_steps=1, micro_batch=2, global_batch=4, checkpoint_every=1)
    _first_step(shared, tmp_path, "tied", 2, {}, project)
