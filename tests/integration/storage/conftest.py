"""Fixtures: one moto S3 server for the session (real HTTP on 127.0.0.1), a fresh bucket per test."""

from __future__ import annotations

import uuid

import boto3
import pytest

from clustertrain.storage import StoreConfig
from tests.support.s3server import dummy_environ, s3_server


@pytest.fixture(scope="session")
def s3_endpoint():
    with dummy_environ(), s3_server() as endpoint:  # dummy credentials for boto3's chain; nothing real is reachable
        yield endpoint


@pytest.fixture
def s3_client(s3_endpoint):
    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def bucket(s3_client):
    name = f"ct-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def options(s3_endpoint):
    return StoreConfig(endpoint_url=s3_endpoint, part_size_mb=5, multipart_threshold_mb=5)
