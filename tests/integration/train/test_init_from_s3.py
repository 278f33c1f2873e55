"""``training.init_from: s3://...``: a Hugging Face directory published through the storage stage (as
``clustertrain export --to`` publishes it: :func:`clustertrain.storage.backup_directory`, checksum manifest) is
fetched once by run preparation into ``<datasets>/hf-<hash>/``, hash-checked, checked against the project, and the
ranks' loader reads that copy. A damaged object is refused in one line. Real S3 protocol: moto's server on
127.0.0.1."""

from __future__ import annotations

import uuid

import boto3
import pytest
import torch

from clustertrain.core.storage_layout import storage_layout
from clustertrain.project import read_project
from clustertrain.storage import StoreConfig, backup_directory
from clustertrain.train.init_from import InitFromError, load_init_from, local_dir
from clustertrain.train.init_from_check import init_from_findings, stage_init_from
from clustertrain.train.model import GPT

from tests.support.s3server import dummy_environ, s3_server
from tests.unit.train.test_init_from import make_hf_dir, project_yaml

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3():
    with dummy_environ(), s3_server() as endpoint:
        bucket = f"ct-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint, bucket


def test_a_published_directory_is_fetched_once_checked_and_loaded(s3, tmp_path):
    from transformers import AutoModelForCausalLM

    endpoint, bucket = s3
    options = StoreConfig(endpoint_url=endpoint)
    hf = make_hf_dir(tmp_path / "hf")
    url = f"s3://{bucket}/models/tiny/"
    assert backup_directory(hf, url, options=options).ok
    project = read_project(project_yaml(tmp_path, url, str(hf / "tokenizer.json")))
    entry = project.models[0]
    assert [f.level for f in init_from_findings(project)] == ["warning"]  # not fetched yet: not verified

    copy = stage_init_from(project, entry, 320, options)
    assert copy == local_dir(project, entry) and copy.parent == storage_layout(project).datasets
    assert copy.name.startswith("hf-") and (copy / "model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()
    assert init_from_findings(project) == []  # the fetched copy is checked offline now
    assert stage_init_from(project, entry, 320, options) == copy  # a second start transfers nothing new

    ours = GPT(entry.model, 320)
    line = load_init_from(ours, project, entry, ours.num_params())
    assert line.startswith(f"weights: init_from {url} (LlamaForCausalLM, ") and line.endswith(f"; local copy {copy})")
    theirs = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    tokens = torch.randint(0, 320, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours.eval()(tokens), theirs(tokens).logits
    assert (a - b).abs().max() < 1e-4 * b.abs().max()


def test_a_damaged_object_is_refused_in_one_line(s3, tmp_path):
    endpoint, bucket = s3
    options = StoreConfig(endpoint_url=endpoint)
    hf = make_hf_dir(tmp_path / "hf", seed=4)
    url = f"s3://{bucket}/models/damaged/"
    assert backup_directory(hf, url, options=options).ok
    data = bytearray((hf / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=bucket, Key="models/damaged/model.safetensors",
                                                         Body=bytes(data))
    project = read_project(project_yaml(tmp_path, url, str(hf / "tokenizer.json")))
    with pytest.raises(InitFromError) as err:
        stage_init_from(project, project.models[0], 320, options)
    assert str(err.value).startswith(f"training.init_from: {url}: ") and "\n" not in str(err.value)
    assert str(err.value).endswith(f"; a directory is published there with `clustertrain export RUN_DIR -o DIR --to {url}`")
