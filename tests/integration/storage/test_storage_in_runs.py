"""Checkpoints go to the checkpoint bucket (moto's S3 server over HTTP) in the background while real
gloo ranks train; the final one comes back into a fresh run directory, from which `run` resumes; a
failed upload is reported and never fails the run."""

from __future__ import annotations

import json
import textwrap

import pytest

from clustertrain.train.config import TrainingConfig
from tests.support.training import metrics, run_cli

pytestmark = pytest.mark.slow

PROJECT = """
name: backup-test
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 2, threads_per_worker: 1}}
storage: {{root: {root}, checkpoint_bucket: "s3://{bucket}/ckpts", endpoint_url: "{endpoint}"}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 6, micro_batch: 4, global_batch: 8, checkpoint_every: 3, log_every: 1}}
"""


def test_final_checkpoint_backed_up_and_restored_run_resumes(tmp_path, s3_endpoint, bucket, s3_client):
    project = tmp_path / "p.yaml"
    project.write_text(textwrap.dedent(PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), bucket=bucket, endpoint=s3_endpoint)))
    first = tmp_path / "first"
    res = run_cli("run", str(project), "--run-dir", str(first))
    assert res.returncode == 0, res.stdout
    url = f"s3://{bucket}/ckpts/backup-test/tiny/step_00000006"
    assert f"backed up to {url}" in res.stdout
    assert json.loads((first / "status.json").read_text())["backup"] == url
    keys = {o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert "ckpts/backup-test/tiny/step_00000006/meta.json" in keys and "ckpts/backup-test/tiny/step_00000006/.metadata" in keys
    assert not any("step_00000003" in k for k in keys)  # only the final checkpoint without training.backup_every
    status = json.loads((first / "status.json").read_text())
    assert [(b["checkpoint"], b["state"]) for b in status["backups"]] == [("step_00000006", "verified")]
    assert status["backup_error"] is None

    fresh = tmp_path / "elsewhere"
    res = run_cli("storage", "restore", url, str(fresh / "checkpoints" / "step_00000006"), "--endpoint-url", s3_endpoint)
    assert res.returncode == 0, res.stdout
    res = run_cli("run", str(project), "--run-dir", str(fresh), "--set", "models.0.training.max_steps=9")
    assert res.returncode == 0, res.stdout
    assert "(step 6)" in res.stdout and "resumed from" in res.stdout
    assert [r["step"] for r in metrics(fresh)] == [7, 8, 9]


def test_published_dataset_is_fetched_verified_and_trained_on(tmp_path, s3_endpoint, bucket):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}: " + "to be or not to be " * 20}) + "\n" for i in range(200)))
    url = f"s3://{bucket}/datasets/corpus-v1"
    res = run_cli("data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "prepared" / "corpus"),
                  "--publish", url, "--endpoint-url", s3_endpoint)
    assert res.returncode == 0, res.stdout
    assert f"published to {url} (verified)" in res.stdout

    project = tmp_path / "p.yaml"
    text = PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), bucket=bucket, endpoint=s3_endpoint)
    project.write_text(textwrap.dedent(text).replace("training: {", f"data: {{source: \"{url}\"}}\n    training: {{"))
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir), "--set", "models.0.training.max_steps=3",
                  "--set", "storage.checkpoint_bucket=null")
    assert res.returncode == 0, res.stdout
    run = json.loads((run_dir / "run.json").read_text())
    fetched = list((tmp_path / "fsx" / "datasets").glob("remote-*/corpus.idx"))
    assert len(fetched) == 1 and run["dataset"] == str(fetched[0].with_suffix(""))
    assert fetched[0].read_bytes() == (tmp_path / "prepared" / "corpus.idx").read_bytes()
    assert [r["step"] for r in metrics(run_dir)] == [1, 2, 3]


@pytest.mark.skipif("backup_every" not in TrainingConfig.model_fields, reason="training.backup_every not in project.py yet")
def test_every_checkpoint_backed_up_in_background_and_keep_last_waits(tmp_path, s3_endpoint, bucket, s3_client):
    project = tmp_path / "p.yaml"
    text = textwrap.dedent(PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), bucket=bucket, endpoint=s3_endpoint))
    project.write_text(text.replace("checkpoint_every: 3,", "checkpoint_every: 3, backup_every: 1, keep_last: 1,")
                       .replace("max_steps: 6", "max_steps: 9"))
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stdout
    status = json.loads((run_dir / "status.json").read_text())
    states = {b["checkpoint"]: b["state"] for b in status["backups"]}
    # every checkpoint was handed over; each was copied or replaced by a newer one while an upload ran
    assert set(states) == {"step_00000003", "step_00000006", "step_00000009"}, status["backups"]
    assert states["step_00000009"] == "verified" and set(states.values()) <= {"verified", "superseded"}
    keys = {o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]}
    for name, state in states.items():
        assert (f"ckpts/backup-test/tiny/{name}/meta.json" in keys) is (state == "verified"), (name, state)
    assert status["backup"] == f"s3://{bucket}/ckpts/backup-test/tiny/step_00000009"
    # keep_last=1 applied once the uploads were done
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_00000009"]
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, 10))


def test_failed_backup_is_reported_and_the_run_still_completes(tmp_path, s3_endpoint):
    project = tmp_path / "p.yaml"
    project.write_text(textwrap.dedent(PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), bucket="no-such-bucket-ct",
                                                      endpoint=s3_endpoint)))
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stdout
    assert "completed tiny: step 6" in res.stdout
    assert "backup failed for 1 checkpoint(s), last: step_00000006" in res.stdout
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["backup"] is None
    assert status["backup_error"] and "no-such-bucket-ct" in status["backup_error"]
    assert "\n" not in status["backup_error"]
