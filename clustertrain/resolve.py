"""The resolver: the one step every command runs after reading a project file, above the stages.

:func:`clustertrain.project.read_project` gives the project as its file describes it, each field checked for its own
shape (and the rules of the sections it composes). What needs another stage's knowledge is added here, once:

==============================  ===========================================================================
step                            what it fills
==============================  ===========================================================================
the deployed infrastructure     ``aws`` network ids and the storage policy ARN the file leaves out, from the
                                stack's state beside the file (:func:`clustertrain.cloud.state.attach_state`)
the built image                 :attr:`Project.container_image` for an ``image:`` section without
                                ``cluster.container_image``: the ``.sqsh`` that ``image build`` writes
                                (:func:`clustertrain.image.paths.sqsh_path`)
==============================  ===========================================================================

The resolver may import the stages; no stage imports it (the import test's direction table says so). A stage that
needs a project receives it resolved from its caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clustertrain.project import Project, read_project, validate_project


def resolve(project: Project) -> Project:
    """Add the stages' derived facts to ``project`` (in place) and return it."""
    from clustertrain.cloud.state import attach_state

    attach_state(project)
    if project.image is not None:
        from clustertrain.image.paths import sqsh_path

        project.attach_built_image(str(sqsh_path(project)))
    return project


def load_project(path: str | Path, overrides: list[str] | None = None) -> Project:
    """Read, override, validate and resolve a project file: what every command works on. One-line ConfigError."""
    return resolve(read_project(path, overrides))


def project_from_mapping(raw: dict[str, Any], source: str = "project", path: Path | None = None) -> Project:
    """Validate a raw mapping (:func:`clustertrain.project.validate_project`) and resolve it."""
    return resolve(validate_project(raw, source, path))
