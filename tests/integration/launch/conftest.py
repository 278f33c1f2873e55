"""Session-wide local Slurm cluster (2 emulated nodes on 127.0.0.1), started once and stopped at the end."""

from __future__ import annotations

import pytest

from tests.support.slurm import local_slurm_cluster


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=2)
