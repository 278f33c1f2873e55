"""Generate the cloud artefacts from a project and write them only when they are valid.

Each function builds the value in memory, checks it, and only then writes (temp file + rename):
a project with mistakes raises :class:`~clustertrain.errors.ConfigError` and leaves no file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.cloud.infra import build_infra_template, render_infra_template
from clustertrain.cloud.pcluster import build_cluster_config, cluster_name, render_cluster_config
from clustertrain.cloud.scripts import render_node_scripts, write_node_scripts
from clustertrain.cloud.validate import ValidationReport, validate_cluster_config
from clustertrain.errors import ConfigError
from clustertrain.rundir import write_atomic

if TYPE_CHECKING:
    from clustertrain.project import Project


def generate_cluster_config(project: "Project", output: Path, use_schema: bool = True) -> ValidationReport:
    """Build, validate (schema when installed + our rules) and write the ParallelCluster config."""
    config = build_cluster_config(project)
    report = validate_cluster_config(config, use_schema=use_schema)
    if report.errors:
        first = report.errors[0]
        more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        raise ConfigError(f"generated cluster config is invalid: {first}{more}; fix the project's aws: section; nothing was written")
    write_atomic(Path(output), render_cluster_config(config, project.name, cluster_name(project)))
    return report


def generate_infra_template(project: "Project", output: Path) -> None:
    write_atomic(Path(output), render_infra_template(build_infra_template(project), project.name))


def generate_node_scripts(project: "Project", out_dir: Path) -> list[Path]:
    return write_node_scripts(render_node_scripts(project), Path(out_dir))
