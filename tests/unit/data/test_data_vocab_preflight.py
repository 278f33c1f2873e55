"""model.vocab vs the tokenizer (one rule for check, plan, run/submit and the trainer) and the data
section of `clustertrain check` (offline findings, on real files and real tokenizers)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clustertrain.data.preflight import data_findings
from clustertrain.data.preprocess import prepare_dataset
from clustertrain.data.staging import published_copy_dir
from clustertrain.data.tokenizers import train_tokenizer
from clustertrain.data.vocab import check_vocab, vocab_limit, vocab_problem
from clustertrain.core.errors import ConfigError
from clustertrain.core.storage_layout import storage_layout
from clustertrain.project import validate_project

FSX = [{"name": "fsx-data", "mount_dir": "/fsx/data", "holds": ["datasets"]},
       {"name": "fsx-ckpt", "mount_dir": "/fsx/checkpoints", "holds": ["checkpoints", "outputs", "logs"]}]


def make(tmp_path: Path, data: dict | None = None, vocab: int | None = None, aws: bool = False, steps: int = 10,
         storage: dict | None = None, models: int = 1, seq_len: int = 64):
    arch = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": seq_len}
    if vocab is not None:
        arch["vocab"] = vocab
    raw = {"name": "proj", "storage": storage or {"root": str(tmp_path / "fsx")},
           "models": [{"name": f"m{i}", "model": arch, "data": data or {},
                       "training": {"max_steps": steps, "micro_batch": 1, "global_batch": 2}} for i in range(1, models + 1)]}
    if aws:
        raw["cluster"] = {"backend": "slurm", "nodes": 2, "gpus_per_node": 8, "instance_type": "p5e.48xlarge", "partition": "gpu"}
        raw["models"] = [dict(m, training={"max_steps": steps, "micro_batch": 1, "global_batch": 16}) for m in raw["models"]]
        raw["aws"] = {"region": "us-east-1", "queues": [{"name": "gpu", "instance_type": "p5e.48xlarge", "max_count": 4}],
                      "fsx": FSX, "buckets": {"data": "my-data", "checkpoints": "my-ckpt"}}
    return validate_project(raw, source="test")


def errors(findings):
    return [f for f in findings if f.level == "error"]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory, shakespeare_lines):
    """A real 512-id byte-level BPE tokenizer.json."""
    d = tmp_path_factory.mktemp("tok")
    corpus = d / "c.jsonl"
    corpus.write_text("\n".join(shakespeare_lines[:400]) + "\n")
    tok = train_tokenizer([corpus], 512, d / "tokenizer.json")
    assert tok.vocab_size == 512
    return d / "tokenizer.json"


# ---- the rule --------------------------------------------------------------------------------
@pytest.mark.parametrize("model_vocab,tok,tp,bad", [
    (None, 258, 1, False),       # unset: padded by the trainer, agrees by construction
    (258, 258, 1, False), (320, 258, 1, False), (384, 258, 1, False),  # 64-padding (ours) and 128-padding (Megatron's)
    (257, 258, 1, True),         # smaller: ids past the embedding
    (385, 258, 1, True), (32000, 258, 1, True),  # the flagship's old mistake
    (32000, 32000, 1, False), (32000, 31990, 1, False), (32128, 32000, 1, True),
    (512, 258, 4, False), (513, 258, 4, True),  # 128 x tp
])
def test_vocab_rule(model_vocab, tok, tp, bad):
    assert (vocab_problem(model_vocab, tok, tp) is not None) is bad
    assert vocab_limit(258) == 384 and vocab_limit(258, 8) == 1024


def test_check_vocab_names_the_field_and_the_fix(tmp_path, bpe):
    p = make(tmp_path, vocab=32000)
    msg = check_vocab(p.models[0])
    assert msg.startswith("models.m1.model.vocab disagrees with data.tokenizer 'byte': 32,000 is far larger than")
    assert "train-tokenizer --vocab-size 32000" in msg and "model.vocab to 384" in msg
    assert check_vocab(make(tmp_path, vocab=384).models[0]) is None
    small = make(tmp_path, vocab=256, data={"tokenizer": str(bpe)}).models[0]
    assert "smaller than the tokenizer's 512 ids" in check_vocab(small) and "to 512" in check_vocab(small)
    assert check_vocab(small, tokenizer_vocab=256) is None  # the size from a manifest is used as given
    with pytest.raises(ConfigError, match="does not exist"):
        check_vocab(make(tmp_path, vocab=512, data={"tokenizer": str(tmp_path / "no" / "tokenizer.json")}).models[0])


# ---- the data section of `check` --------------------------------------------------------------
def test_builtin_with_a_32k_vocab_is_an_error_and_epochs_are_counted(tmp_path):
    found = data_findings(make(tmp_path, vocab=32000, steps=10_000_000, models=3))
    errs = errors(found)
    assert len(errs) == 1 and errs[0].path == "models.m1.model.vocab (and 2 more models)"  # one line for three models
    warn = [f for f in found if f.level == "warning"]
    assert len(warn) == 1 and "passes over the 1,256,988 tokens of builtin:shakespeare" in warn[0].message
    assert data_findings(make(tmp_path)) == []  # the quickstart shape is clean


def test_prepared_prefix_checked_against_tokenizer_size_and_seq_len(tmp_path, bpe, write_jsonl):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["to be or not to be"] * 3)
    prefix = tmp_path / "ds" / "c"
    prepare_dataset([corpus], prefix, "byte")
    assert data_findings(make(tmp_path, data={"source": str(prefix)}, seq_len=16, steps=1)) == []
    # made with another tokenizer than data.tokenizer
    found = errors(data_findings(make(tmp_path, data={"source": str(prefix), "tokenizer": str(bpe)}, seq_len=16, steps=1)))
    assert any("was made with tokenizer 'byte-v1'" in f.message for f in found)
    # too small for one sample
    found = errors(data_findings(make(tmp_path, data={"source": str(prefix)}, seq_len=512)))
    assert [f.path for f in found] == ["models.m1.model.seq_len"] and "holds 57" in found[0].message
    # changed after prepare
    Path(f"{prefix}.bin").write_bytes(Path(f"{prefix}.bin").read_bytes()[:-2])
    assert any("do not match their manifest" in f.message for f in data_findings(make(tmp_path, data={"source": str(prefix)}, seq_len=16, steps=1)))


def test_missing_things_are_errors_on_a_local_project(tmp_path):
    found = errors(data_findings(make(tmp_path, data={"source": str(tmp_path / "nothing*.jsonl"),
                                                      "tokenizer": str(tmp_path / "tok" / "tokenizer.json")})))
    assert {f.path for f in found} == {"models.m1.data.source", "models.m1.data.tokenizer"}
    bad = tmp_path / "bad" / "tokenizer.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    found = errors(data_findings(make(tmp_path, data={"tokenizer": str(bad)})))
    assert found[0].path == "models.m1.data.tokenizer" and "not a valid tokenizer.json" in found[0].message


def test_s3_source_is_an_honest_warning_offline(tmp_path):
    found = data_findings(make(tmp_path, data={"source": "s3://bucket/datasets/web/"}))
    assert [f.level for f in found] == ["warning"]
    assert "was not verified" in found[0].message and "which tokenizer made it" in found[0].message


def test_s3_source_checked_from_a_staged_copy_when_there_is_one(tmp_path, bpe, write_jsonl):
    url = "s3://my-data/datasets/web/"
    p = make(tmp_path, data={"source": url, "tokenizer": str(bpe)}, vocab=512)
    copy = published_copy_dir(url, storage_layout(p).datasets)
    prepare_dataset([write_jsonl(tmp_path / "c.jsonl", ["hello world"] * 50)], copy / "web", "byte")
    found = data_findings(p)
    assert [f.path for f in errors(found)] == ["models.m1.data.source"]
    assert "the staged copy of s3://my-data/datasets/web/ was made with tokenizer 'byte-v1'" in errors(found)[0].message
    assert not any("was not verified" in f.message for f in found)


def test_cluster_project_paths_the_head_node_cannot_see(tmp_path, bpe):
    raw = tmp_path / "corpus.jsonl"
    raw.write_text('{"text": "x"}\n')
    found = data_findings(make(tmp_path, aws=True, data={"source": str(raw)}))
    assert [f.path for f in errors(found)] == ["models.m1.data.source"]
    assert "not on a shared file system" in found[0].message
    assert "--publish s3://my-data/datasets/NAME/" in found[0].fix and "data prepare" in found[0].fix
    # on a mount, absent here: a warning that says nothing was verified
    found = data_findings(make(tmp_path, aws=True, data={"source": "/fsx/data/raw/*.jsonl",
                                                           "tokenizer": "/fsx/data/tok/tokenizer.json"}, vocab=32000))
    assert [f.level for f in found] == ["warning", "warning"]
    assert "model.vocab was not verified" in found[0].message and "head node" in found[0].fix
    # an existing tokenizer off the mounts: read where submit runs
    found = data_findings(make(tmp_path, aws=True, data={"tokenizer": str(bpe)}, vocab=512))
    assert [f.level for f in found] == ["warning"] and "where `submit` runs" in found[0].message
    # an s3 source the nodes' policy cannot read
    found = data_findings(make(tmp_path, aws=True, data={"source": "s3://someone-else/ds/"}))
    assert any("not one the cluster's IAM policy lets the nodes read (my-ckpt, my-data)" in f.message for f in found)
    assert not any("IAM" in f.message for f in data_findings(make(tmp_path, aws=True, data={"source": "s3://my-data/ds/"})))


def test_flagship_data_setup_checks_fast_and_without_errors(tmp_path):
    """The data setup the flagship example is meant to carry: published dataset, tokenizer on /fsx/data."""
    p = make(tmp_path, aws=True, vocab=32000, models=7, steps=100_000,
             data={"source": "s3://my-data/datasets/web-32k/", "tokenizer": "/fsx/data/tokenizers/bpe-32k/tokenizer.json"})
    t0 = time.perf_counter()
    found = data_findings(p)
    assert time.perf_counter() - t0 < 1.0
    assert errors(found) == [] and len(found) == 2  # one per distinct fact, not seven
    assert all("(and 6 more models)" in f.path for f in found)
    json.dumps([f.__dict__ for f in found])  # plain data for the check's --format json


def test_models_each_with_their_own_unverified_dataset_are_one_warning_naming_every_url(tmp_path):
    """The flagship's data-mixture models: one dataset each, none verifiable offline — one line, every URL in it."""
    p = make(tmp_path, aws=True, vocab=32000, models=3,
             data={"source": "s3://my-data/datasets/web-32k/", "tokenizer": "/fsx/data/tokenizers/bpe-32k/tokenizer.json"})
    raw = p.model_dump(mode="json", exclude_none=True)
    for i, m in enumerate(raw["models"], 1):
        m["data"]["source"] = f"s3://my-data/datasets/mix-{i}/"
    found = [f for f in data_findings(validate_project(raw, source="test")) if f.path.startswith("models.m1.data.source")]
    assert len(found) == 1 and found[0].path == "models.m1.data.source (and 2 more models)", found
    assert found[0].message.startswith("s3://my-data/datasets/mix-1/ was not verified")
    assert found[0].message.endswith("(the same for s3://my-data/datasets/mix-2/, s3://my-data/datasets/mix-3/)")
    assert "--publish s3://my-data/datasets/mix-1/" in found[0].fix
