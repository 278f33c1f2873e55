"""A moto server whose CloudFormation deploys, reports and deletes our infrastructure template like AWS does.

``cfn_server()`` yields the endpoint URL (``http://127.0.0.1:PORT``) of a fresh server on a free port and stops it
after. It is moto's own server (every AWS service over real HTTP: CloudFormation, EC2, S3, IAM...) started as
``python -m tests.support.moto_cfn_server``, which first applies small, documented fixes for what moto 5.2's
CloudFormation gets wrong for our template (see that module's docstring): Outputs after ExecuteChangeSet, DeleteStack
of every non-Retain resource in reverse dependency order, per-resource stack events, rollback instead of API errors,
CloudFormation's refusals of CreateChangeSet, bucket policies / security group egress / route table associations,
bucket properties, replacement or in-place update where CloudFormation does them, and FSx for Lustre file systems as
AWS answers them, also for ``AWS::FSx::FileSystem`` (tests/support/moto_fsx.py); ``RetainExceptOnCreate`` as AWS
applies it.

Clients need credentials and a region like any boto3 client: ``tests.support.s3server.dummy_env()``.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.s3server import free_port, serve

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def cfn_server(timeout_s: float = 30.0) -> Iterator[str]:
    """Run moto's server with the CloudFormation fixes; yields its endpoint URL. Its log is kept (in a temporary
    directory) only for the error if it fails to start."""
    port = free_port()
    command = [sys.executable, "-m", "tests.support.moto_cfn_server", "-H", "127.0.0.1", "-p", str(port)]
    with tempfile.TemporaryDirectory(prefix="moto-cfn-") as tmp, \
            serve(command, port, timeout_s, cwd=ROOT, log=Path(tmp) / "server.log") as endpoint:
        yield endpoint
