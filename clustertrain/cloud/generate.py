"""Generate the cloud artefacts from a project and write them only when they are valid.

Each function builds the value in memory, checks it, and only then writes (temp file + rename):
a project with mistakes raises :class:`~clustertrain.core.errors.ConfigError` and leaves no file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.cloud.infra import build_infra_template, render_infra_template
from clustertrain.cloud.pcluster import build_cluster_config, cluster_name, render_cluster_config
from clustertrain.cloud.scripts import render_node_scripts, write_node_scripts
from clustertrain.cloud.preflight import cloud_report
from clustertrain.cloud.validate import ValidationReport
from clustertrain.core.errors import ConfigError
from clustertrain.core.run_paths import write_atomic

if TYPE_CHECKING:
    from clustertrain.project import Project


def generate_cluster_config(project: "Project", output: Path, use_schema: bool = True) -> ValidationReport:
    """Check the project as ``clustertrain check`` does (:func:`~clustertrain.cloud.preflight.cloud_report`), then write the
    ParallelCluster config; on an error nothing is written and the first error is raised as one line."""
    report = cloud_report(project, use_schema=use_schema)
    if report.errors:
        first = report.errors[0]
        more = f" (and {len(report.errors) - 1} more: clustertrain cluster validate PROJECT)" if len(report.errors) > 1 else ""
        raise ConfigError(f"{first.path}: {first.message}; fix: {first.fix}{more}; nothing was written")
    config = build_cluster_config(project)
    write_atomic(Path(output), render_cluster_config(config, project.name, cluster_name(project)))
    return report


def generate_infra_template(project: "Project", output: Path) -> None:
    write_atomic(Path(output), render_infra_template(build_infra_template(project), project.name))


def generate_node_scripts(project: "Project", out_dir: Path) -> list[Path]:
    return write_node_scripts(render_node_scripts(project), Path(out_dir))
