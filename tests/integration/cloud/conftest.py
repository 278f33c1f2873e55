"""The cloud scenario fixtures, shared with the unit tests."""

from tests.unit.cloud.conftest import make_project, scenario  # noqa: F401
