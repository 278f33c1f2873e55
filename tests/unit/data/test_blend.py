"""``data.blend``: several sources mixed by weight (Megatron's ``--data-path W1 P1 W2 P2``; the built-in trainer reads
them with :func:`training_samples`).

Staging prepares every source as ``data.source`` is prepared (:func:`stage_sources`), refusing a source of another
tokenizer under its own field; ``submit --dry-run`` names the prefixes without writing anything
(:func:`expected_prefix`); ``clustertrain check`` checks each source under its own field
(:mod:`clustertrain.data.preflight`). A built-in run with a blend: tests/integration/train/test_blend_run.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from clustertrain.data.config import DataConfig
from clustertrain.data.indexed import IndexedDataset
from clustertrain.data.preflight import data_findings
from clustertrain.data.preprocess import prepare_dataset
from clustertrain.data.sample_index import GPTSamples
from clustertrain.data.staging import expected_prefix, stage_dataset, stage_sources, training_samples
from clustertrain.core.errors import ConfigError, DataError
from clustertrain.project import validate_project
from clustertrain.resolve import load_project

WEB = ["the web says hello", "a second web page, longer than the first one", "ünïcödé web text"]
CODE = ["def f(x):\n    return x + 1\n", "print('code')"]


def snapshot(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def two_sources(tmp_path, write_jsonl) -> tuple[Path, Path]:
    (tmp_path / "raw").mkdir()
    return write_jsonl(tmp_path / "raw" / "web.jsonl", WEB), write_jsonl(tmp_path / "raw" / "code.jsonl", CODE)


def test_stage_sources_prepares_each_source_of_a_blend(tmp_path, two_sources, megatron):
    web, code = two_sources
    cfg = DataConfig(blend=[{"source": str(web), "weight": 0.7}, {"source": str(code), "weight": 0.3}], workers=1)
    staged = stage_sources(cfg, tmp_path / "datasets")
    assert [w for w, _ in staged] == [0.7, 0.3]
    for (_, prefix), texts in zip(staged, (WEB, CODE)):
        assert prefix.parent.parent == tmp_path / "datasets"
        assert prefix.with_suffix(".idx").read_bytes()[:9] == b"MMIDIDX\x00\x00"
        # megatron-core reads it, and its documents are the source's texts (bytes + eod 256)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = megatron.indexed.IndexedDataset(str(prefix), mmap=True)
        assert len(theirs) == len(texts)
        for i, text in enumerate(texts):
            assert theirs[i].tolist() == [*text.encode("utf-8"), 256]
        assert json.loads(prefix.with_suffix(".manifest.json").read_text())["tokenizer"] == "byte-v1"
    assert staged[0][1] != staged[1][1]
    # a second staging finds both prepared and returns the same prefixes
    assert stage_sources(cfg, tmp_path / "datasets") == staged
    # no blend: the one source, weight 1
    single = DataConfig(source=str(web), workers=1)
    assert stage_sources(single, tmp_path / "datasets") == [(1.0, staged[0][1])]


def test_expected_prefix_predicts_staging_without_writing(tmp_path, two_sources):
    web, code = two_sources
    root = tmp_path / "datasets"
    prepared = tmp_path / "ready" / "corpus"
    prepared.parent.mkdir()
    prepare_dataset([str(code)], prepared, "byte")
    configs = {
        "raw": DataConfig(source=str(web), workers=1),
        "raw-glob": DataConfig(source=str(tmp_path / "raw" / "*.jsonl"), workers=1),
        "builtin": DataConfig(source="builtin:shakespeare", workers=1),
        "prepared": DataConfig(source=str(prepared)),
        "raw-other-key": DataConfig(source=str(web), json_key="body", workers=1),
    }
    before = snapshot(tmp_path)
    predicted = {name: expected_prefix(cfg, root) for name, cfg in configs.items()}
    assert snapshot(tmp_path) == before and not root.exists()  # nothing prepared, no directory made
    assert predicted["prepared"] == prepared
    assert predicted["builtin"].name == "shakespeare" and predicted["raw"].name == "web"
    assert len(set(predicted.values())) == len(predicted)  # inputs and json_key are part of the key
    for name in ("raw", "raw-glob", "builtin", "prepared"):
        assert stage_dataset(configs[name], root) == predicted[name], name
    # the blend's prefixes are the sources' own
    blend = DataConfig(blend=[{"source": str(web), "weight": 2}, {"source": str(prepared), "weight": 1}], workers=1)
    assert [expected_prefix(one, root) for _, one in blend.sources()] == [predicted["raw"], prepared]
    assert [p for _, p in stage_sources(blend, root)] == [predicted["raw"], prepared]


def _write_project(tmp_path: Path, model_lines: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text("name: blend\ncluster: {backend: local, gpus_per_node: 2}\nstorage: {root: runs}\nmodels:\n"
                    "  - name: m\n    model: {layers: 2, hidden: 64, heads: 4, seq_len: 32}\n"
                    "    training: {max_steps: 1, micro_batch: 1, global_batch: 2}\n" + model_lines)
    return path


def test_a_blend_loads_for_either_trainer(tmp_path):
    """The built-in trainer reads a blend (it refused one before issue 39); its sources resolve against the file."""
    for framework in ("", "    framework: megatron\n"):
        path = _write_project(tmp_path, framework + "    data: {blend: [{source: a.jsonl, weight: 1}, "
                                                    "{source: b.jsonl, weight: 3}]}\n")
        entry = load_project(path).models[0]
        assert entry.framework == (framework and "megatron" or "clustertrain")
        assert [(b.source, b.weight) for b in entry.data.blend] == [(str(tmp_path / "a.jsonl"), 1),
                                                                    (str(tmp_path / "b.jsonl"), 3)]
        assert not [f for f, _ in entry.structure_problems() if f.startswith("data")]


def _other_tokenizers_dataset(tmp_path, text):
    """A prepared dataset whose manifest names another tokenizer than ``byte``."""
    other = tmp_path / "other" / "ds"
    other.parent.mkdir()
    prepare_dataset([str(text)], other, "byte")
    manifest = other.with_suffix(".manifest.json")
    manifest.write_text(manifest.read_text().replace('"byte-v1"', '"hf-0123456789abcdef"'))  # another tokenizer's data
    return other


def test_a_blend_source_of_another_tokenizer_is_refused_under_its_field_before_anything_is_staged(tmp_path, two_sources):
    web, code = two_sources
    other = _other_tokenizers_dataset(tmp_path, code)
    cfg = DataConfig(blend=[{"source": str(web), "weight": 1}, {"source": str(other), "weight": 1}], workers=1)
    before = snapshot(tmp_path)
    with pytest.raises(DataError) as e:
        stage_sources(cfg, tmp_path / "datasets")
    assert len(str(e.value).splitlines()) == 1
    assert str(e.value).startswith(f"data.blend[1].source: {other}: manifest.tokenizer: ")
    assert "made with tokenizer 'hf-0123456789abcdef', expected 'byte-v1'" in str(e.value)
    assert snapshot(tmp_path) == before  # the raw source [0] was not tokenized first


def test_training_samples_mix_the_sources_in_the_weights_proportion(tmp_path):
    """Disjoint token ids per source: every sample comes from one source, and any window of samples holds each in
    the weights' proportion (Megatron's greedy rule); one source alone is its own GPTSamples."""
    a, b = tmp_path / "a" / "ds", tmp_path / "b" / "ds"
    for prefix, ch in ((a, "a"), (b, "B")):
        prefix.parent.mkdir()
        (prefix.parent / "in.jsonl").write_text("".join(json.dumps({"text": ch * 500}) + "\n" for _ in range(8)))
        prepare_dataset([str(prefix.parent / "in.jsonl")], prefix, "byte")
    cfg = DataConfig(blend=[{"source": str(a), "weight": 3}, {"source": str(b), "weight": 1}])
    samples = training_samples([(3.0, a), (1.0, b)], cfg, seq_len=32, seed=5, vocab_size=257)
    batch = samples.batch(0, 400)
    from_a = np.isin(batch, [ord("a"), 256]).all(axis=1)
    from_b = np.isin(batch, [ord("B"), 256]).all(axis=1)
    assert (from_a ^ from_b).all()
    assert from_a.sum() == 300 and all(from_a[i:i + 4].sum() == 3 for i in range(0, 400, 4))
    # the blend's size comes from the sources' one-epoch counts (125 + 125 samples), not from max_steps: Megatron's
    # ceil(N x w) per source
    assert len(samples) == math.ceil(250 * 0.75) + math.ceil(250 * 0.25) == 251
    one = training_samples([(3.0, a)], DataConfig(source=str(a)), seq_len=32, seed=5)
    assert (one.batch(0, 20) == GPTSamples(str(a), 32, 5).batch(0, 20)).all()


def test_a_blend_and_a_source_together_are_refused(tmp_path):
    path = _write_project(tmp_path, "    framework: megatron\n    data: {source: c.jsonl, "
                                    "blend: [{source: a.jsonl, weight: 1}]}\n")
    with pytest.raises(ConfigError) as e:
        load_project(path)
    assert len(str(e.value).splitlines()) == 1
    assert "give data.source or data.blend, not both" in str(e.value)


def _megatron_project(tmp_path: Path, data: dict, steps: int = 1):
    return validate_project({
        "name": "blend", "cluster": {"backend": "local", "gpus_per_node": 2}, "storage": {"root": str(tmp_path / "runs")},
        "models": [{"name": "m", "framework": "megatron", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32},
                    "data": data, "training": {"max_steps": steps, "micro_batch": 1, "global_batch": 2}}]}, source="test")


def test_check_reads_every_source_of_a_blend_under_its_own_field(tmp_path, two_sources):
    web, code = two_sources
    other = _other_tokenizers_dataset(tmp_path, code)
    project = _megatron_project(tmp_path, {"blend": [
        {"source": str(web), "weight": 1}, {"source": str(tmp_path / "missing.jsonl"), "weight": 1},
        {"source": str(other), "weight": 1}, {"source": "builtin:shakespear", "weight": 1}]})
    found = {f.path: f for f in data_findings(project)}
    assert set(found) == {"models.m.data.blend[1].source", "models.m.data.blend[2].source",
                          "models.m.data.blend[3].source"}, found
    assert "missing.jsonl: no such file" in found["models.m.data.blend[1].source"].message
    assert "made with tokenizer 'hf-0123456789abcdef', but data.tokenizer is 'byte-v1'" in \
        found["models.m.data.blend[2].source"].message
    assert "unknown built-in corpus 'builtin:shakespear'" in found["models.m.data.blend[3].source"].message
    assert all(f.level == "error" for f in found.values())
    # data.source keeps its default under a blend and is not read
    assert not any(f.path.endswith("data.source") for f in found.values())


def test_check_counts_a_blend_source_by_its_share_of_the_samples(tmp_path, two_sources):
    web, code = two_sources
    small, big = tmp_path / "small" / "ds", tmp_path / "big" / "ds"
    for prefix, texts in ((small, ["x" * 40]), (big, ["y" * 4000])):
        prefix.parent.mkdir()
        (prefix.parent / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        prepare_dataset([str(prefix.parent / "in.jsonl")], prefix, "byte")
    # 40 steps x 2 x 32 = 2,560 tokens: 10% of them is 256 from `big` (4,001 tokens): under a pass; 90% from `small`
    # (41 tokens): more than 4 passes, and with seq_len 64 it holds less than one sample
    data = {"blend": [{"source": str(small), "weight": 9}, {"source": str(big), "weight": 1}]}
    found = data_findings(_megatron_project(tmp_path, data, steps=40))
    assert [(f.level, f.path) for f in found] == [("warning", "models.m.data.blend[0].source")], found
    assert "~2,304 tokens of it (90% of the blend's weight" in found[0].message and "56 passes" in found[0].message
    project = _megatron_project(tmp_path, data, steps=40)
    project.models[0].model.seq_len = 64
    [too_small] = [f for f in data_findings(project) if f.level == "error"]
    assert too_small.path == "models.m.model.seq_len" and f"but {small} holds 41" in too_small.message


def test_indexed_blend_sources_are_read_back_by_our_reader(tmp_path, two_sources):
    """The prefixes staging returns are what the rest of clustertrain reads (GPTSamples, dataset_tokens)."""
    web, code = two_sources
    cfg = DataConfig(blend=[{"source": str(web), "weight": 1}, {"source": str(code), "weight": 3}], workers=1)
    for (_, prefix), texts in zip(stage_sources(cfg, tmp_path / "datasets"), (WEB, CODE)):
        ds = IndexedDataset(prefix)
        assert int(ds.sequence_lengths.sum()) == sum(len(t.encode()) + 1 for t in texts)
        assert np.asarray(ds[0]).tolist()[:-1] == list(texts[0].encode())
