"""The generated storage policy, enforced: moto's S3 server with IAM authorization on, an IAM user whose ONLY policy
is ``storage_policy_document(project)``, and clustertrain's own storage calls made with that user's keys.

What moto 5.2 enforces (moto/iam/access_control.py, moto/s3/responses.py; its docs call it "very basic"):
- Action and Resource of Allow statements are matched (``*`` wildcards) against the action moto derives from
  the request (GetObject, PutObject incl. multipart, DeleteObject, AbortMultipartUpload, ListMultipartUploadParts,
  ListBucket, ListBucketMultipartUploads, DeleteBucket, PutBucketPolicy...) and the ARN ``arn:aws:s3:::bucket[/key]``.
  So a write or delete outside our prefixes is refused, as on AWS.
- Conditions: only the keys moto fills in are evaluated; ``s3:prefix`` is not, so a ListBucket statement with a
  prefix condition would be refused outright. Our policy has no conditions (listing key names of our two buckets is
  allowed; reading objects is not, outside the data bucket and our prefixes).
- DeleteObjects (the batch call S3Store.delete uses) is authorized in moto against the BUCKET ARN, where AWS checks
  s3:DeleteObject per key. With a prefix-scoped DeleteObject, moto refuses every batch delete, even of our own keys.
  S3Store.delete sends a single key as DeleteObject (authorised per key everywhere), which is what a re-sync
  that replaces its manifest does (test_a_resync_that_rewrites_the_manifest).
- Bucket policies (our TLS-only deny) are not evaluated with IAM users here.
The first INITIAL_NO_AUTH_ACTION_COUNT requests (the setup below) run unauthenticated; every later one is authorized.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3
import botocore.exceptions
import pytest

from clustertrain.cloud.infra import storage_policy_document
from clustertrain.storage import StoreConfig, backup_directory, restore_directory, sync, verify
from tests.support.s3server import dummy_env, s3_server

pytestmark = pytest.mark.slow

SETUP_REQUESTS = 8  # exactly the setup calls in `enforced` below


@pytest.fixture(scope="module")
def enforced(tmp_path_factory):
    """(endpoint, project, user credentials) with IAM enforcement on after the setup requests."""
    import yaml

    from clustertrain.resolve import load_project
    from tests.unit.cloud.conftest import scenario_raw

    path = tmp_path_factory.mktemp("project") / "p5e-80x7.yaml"
    path.write_text(yaml.safe_dump(scenario_raw()))
    project = load_project(path)  # derives storage.checkpoint_bucket / data_bucket from aws.buckets
    saved = dict(os.environ)
    env = dummy_env(INITIAL_NO_AUTH_ACTION_COUNT=str(SETUP_REQUESTS))  # before clear(): it keeps PATH, HOME...
    os.environ.clear()
    os.environ.update(env)
    try:
        with s3_server() as endpoint:
            s3 = boto3.client("s3", endpoint_url=endpoint)
            iam = boto3.client("iam", endpoint_url=endpoint)
            s3.create_bucket(Bucket="training-data-jakarta")                                      # 1
            s3.create_bucket(Bucket="checkpoint-jakarta")                                         # 2
            s3.put_object(Bucket="checkpoint-jakarta", Key="someone-else/keep.bin", Body=b"x")    # 3
            s3.put_object(Bucket="training-data-jakarta", Key="raw/corpus.txt", Body=b"text")     # 4
            iam.create_user(UserName="node")                                                      # 5
            doc = storage_policy_document(project, partition="aws")
            arn = iam.create_policy(PolicyName="storage", PolicyDocument=json.dumps(doc))["Policy"]["Arn"]  # 6
            iam.attach_user_policy(UserName="node", PolicyArn=arn)                                # 7
            key = iam.create_access_key(UserName="node")["AccessKey"]                             # 8
            creds = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
            yield endpoint, project, creds
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def as_node(enforced, monkeypatch):
    endpoint, project, creds = enforced
    for k, v in creds.items():
        monkeypatch.setenv(k, v)
    return endpoint, project


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "model.pt").write_bytes(os.urandom(6 << 20))  # > part size: a multipart upload
    (root / "sub" / "meta.json").write_text('{"step": 100}')
    return root


def test_enforcement_is_on(enforced):
    endpoint, _, _ = enforced
    s3 = boto3.session.Session().client("s3", endpoint_url=endpoint)  # dummy setup credentials: no IAM user behind them
    with pytest.raises(botocore.exceptions.ClientError) as err:
        s3.list_objects_v2(Bucket="checkpoint-jakarta")
    assert err.value.response["Error"]["Code"] in ("InvalidAccessKeyId", "AccessDenied")


def test_backup_verify_restore_and_publish_with_exactly_the_policy(as_node, tmp_path):
    endpoint, project = as_node
    options = StoreConfig(endpoint_url=endpoint, part_size_mb=5, multipart_threshold_mb=5)
    ckpt = _tree(tmp_path / "step_100")
    url = f"{project.storage.checkpoint_bucket}/{project.name}/model-1/step_100"
    assert url == "s3://checkpoint-jakarta/checkpoints/p5e-80x7/model-1/step_100"

    result = backup_directory(ckpt, url, options=options)          # the checkpoint backup: sync + verify
    assert result.ok and result.sync.transferred_files == 2
    assert verify(url, options=options).ok
    restored = restore_directory(url, tmp_path / "restored", options=options)
    assert restored.transferred_files == 2
    assert (tmp_path / "restored" / "model.pt").read_bytes() == (ckpt / "model.pt").read_bytes()

    published = sync(_tree(tmp_path / "dataset"), f"{project.storage.data_bucket}/gpt-32k", options=options)
    assert published.manifest_written                               # publish prefix of the data bucket: writable


def test_writes_and_deletes_outside_our_prefixes_are_denied(as_node, tmp_path):
    endpoint, _ = as_node
    s3 = boto3.session.Session().client("s3", endpoint_url=endpoint)  # a fresh session reads the node's keys
    denied = []
    for call in (
        lambda: s3.delete_object(Bucket="checkpoint-jakarta", Key="someone-else/keep.bin"),   # someone else's object
        lambda: s3.put_object(Bucket="checkpoint-jakarta", Key="someone-else/new.bin", Body=b"y"),
        lambda: s3.put_object(Bucket="training-data-jakarta", Key="raw/corpus.txt", Body=b"overwrite"),
        lambda: s3.delete_bucket(Bucket="checkpoint-jakarta"),
        lambda: s3.put_bucket_policy(Bucket="checkpoint-jakarta", Policy="{}"),
        lambda: s3.get_object(Bucket="checkpoint-jakarta", Key="someone-else/keep.bin"),       # not ours to read either
    ):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            call()
        denied.append(err.value.response["Error"]["Code"])
    assert denied == ["AccessDenied"] * 6
    # reading the data bucket is allowed anywhere in it
    assert s3.get_object(Bucket="training-data-jakarta", Key="raw/corpus.txt")["Body"].read() == b"text"
    # and the object we may not delete is still there (checked through an allowed call: listing)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="checkpoint-jakarta", Prefix="someone-else/").get("Contents", [])]
    assert keys == ["someone-else/keep.bin"]


def test_a_resync_that_rewrites_the_manifest(as_node, tmp_path):
    """A second backup of a changed directory removes the old manifest first (sync.py step 4) and uploads the change."""
    endpoint, project = as_node
    options = StoreConfig(endpoint_url=endpoint, part_size_mb=5, multipart_threshold_mb=5)
    src = _tree(tmp_path / "step_200")
    url = f"{project.storage.checkpoint_bucket}/{project.name}/model-2/step_200"
    assert backup_directory(src, url, options=options).ok
    (src / "sub" / "meta.json").write_text('{"step": 200}')
    again = backup_directory(src, url, options=options)  # one key to delete: DeleteObject, authorised per key
    assert again.ok and again.sync.transferred_files == 1
