"""The cloud scenario fixtures, shared with the unit tests, and ``cfn_endpoint``: a moto server whose CloudFormation
behaves like AWS for our infrastructure template (tests/support/moto_cfn.py), one per test module."""

from collections.abc import Iterator

import pytest

from tests.unit.cloud.conftest import make_project, scenario  # noqa: F401


@pytest.fixture(scope="module")
def cfn_endpoint() -> Iterator[str]:
    """Endpoint URL (``http://127.0.0.1:PORT``) of a fresh moto server with the CloudFormation fixes, for the whole
    module. While it runs, os.environ has dummy AWS credentials and no AWS config files (restored after)."""
    from tests.support.moto_cfn import cfn_server
    from tests.support.s3server import dummy_environ

    with dummy_environ(), cfn_server() as endpoint:
        yield endpoint
