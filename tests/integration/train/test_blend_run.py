"""A built-in run over a ``data.blend``: real `clustertrain run`, 2 gloo ranks, two raw sources mixed 3:1.

The sources' token ids are disjoint — source ``a`` is the byte ``a`` repeated, source ``b`` random letters ``A``-``P``
— so each sample shows where it came from, and the loss shows what the ranks trained on: ``a`` is learned to ~0,
``b`` stays near ln 16 (uniform over 16 letters), so a 3:1 blend ends near 0.25 x ln 16 ≈ 0.69 — ~0 had the ranks
read ``a`` only, ~1.39 for an even mix, ~2.77 for ``b`` only.
"""

from __future__ import annotations

import json
import math
import random
import textwrap
from pathlib import Path

import numpy as np
import pytest

from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import read_run_info
from clustertrain.resolve import load_project
from clustertrain.train.feed import open_samples

from tests.support.training import metrics, run_cli

pytestmark = pytest.mark.slow

STEPS, GLOBAL_BATCH = 60, 16
PROJECT = """
name: blend
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 2, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    data:
      tokenizer: byte
      blend:
        - {{source: a.jsonl, weight: 3}}
        - {{source: b.jsonl, weight: 1}}
    training: {{max_steps: {steps}, micro_batch: 4, global_batch: {batch}, lr: 3.0e-3, min_lr: 3.0e-4,
               warmup_steps: 4, checkpoint_every: 1000, log_every: 1, seed: 7}}
"""


def write_sources(where: Path) -> None:
    rng = random.Random(0)
    letters = [chr(c) for c in range(ord("A"), ord("Q"))]
    docs = {"a.jsonl": ["a" * 2000 for _ in range(10)],
            "b.jsonl": ["".join(rng.choice(letters) for _ in range(2000)) for _ in range(10)]}
    for name, texts in docs.items():
        (where / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def test_a_built_in_run_trains_on_both_sources_of_a_blend_in_the_weights_proportion(tmp_path):
    write_sources(tmp_path)
    project = tmp_path / "p.yaml"
    project.write_text(textwrap.dedent(PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), steps=STEPS,
                                                      batch=GLOBAL_BATCH)))
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stdout

    # run.json records both staged sources; `dataset` stays the first one's prefix for older readers
    paths = RunPaths(run_dir)
    run = read_run_info(paths)
    assert [b.weight for b in run.blend] == [3.0, 1.0]
    a, b = (Path(x.prefix) for x in run.blend)
    assert run.dataset == str(a) and (a.parent.name.startswith("a-"), b.parent.name.startswith("b-")) == (True, True)
    assert run.sources() == [(3.0, str(a)), (1.0, str(b))]

    # what the ranks read: the samples of every step, from the ranks' own open_samples over this run directory
    entry = load_project(project).models[0]
    samples, vocab = open_samples(paths, entry)
    assert vocab == 258  # the byte tokenizer: 256 bytes + its specials
    batch = samples.batch(0, STEPS * GLOBAL_BATCH)
    from_a = np.isin(batch, [ord("a"), 256]).all(axis=1)
    from_b = np.isin(batch, np.r_[ord("A"):ord("Q"), 256]).all(axis=1)
    assert (from_a ^ from_b).all()
    per_step = from_a.reshape(STEPS, GLOBAL_BATCH).sum(axis=1)
    assert (per_step == 12).all(), per_step  # every step: 12 samples of a, 4 of b (3:1)

    # and what they trained on: the loss of a 3:1 blend (see the module docstring)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    late = sum(r["loss"] for r in rows[-10:]) / 10
    expected = 0.25 * math.log(16)
    assert 0.7 * expected < late < 1.35 * expected, (late, expected, [round(r["loss"], 3) for r in rows])
