"""The cloud stage: AWS ParallelCluster config, CloudFormation infrastructure and node scripts,
generated from the project file and validated offline (no AWS calls).

Public API (imported lazily: ``project.py`` imports ``cloud.config``, which runs this file, so it
imports nothing at import time):
    AwsConfig                                  the project file's ``aws:`` section (config.py)
    build_cluster_config, render_cluster_config   ParallelCluster 3 config as a dict / YAML (pcluster.py)
    validate_cluster_config, ValidationReport  pcluster schema + pure validators + our rules (validate.py)
    check_cluster_config, Finding              our own rules only (rules.py; boot phases in phases.py)
    cloud_findings, cloud_report, validate_file   the stage's preflight for `clustertrain check` and
                                               `cluster validate` (preflight.py)
    project_findings                           project-level aws: checks as findings (project_rules.py)
    build_infra_template, render_infra_template, storage_policy_document  CloudFormation, node IAM policy (infra.py)
    render_node_scripts, write_node_scripts, model_dirs   node setup scripts (scripts.py)
    generate_cluster_config, generate_infra_template, generate_node_scripts   build, check, write (generate.py)
    load_catalog, InstanceCatalog, InstanceFacts  instance facts (catalog.py)

Modules here never import clustertrain.project at import time (project.py imports cloud.config).
"""

from clustertrain.core.lazy import lazy_exports

_PUBLIC = {
    "InstanceCatalog": "clustertrain.cloud.catalog",
    "InstanceFacts": "clustertrain.cloud.catalog",
    "load_catalog": "clustertrain.cloud.catalog",
    "AwsConfig": "clustertrain.cloud.config",
    "generate_cluster_config": "clustertrain.cloud.generate",
    "generate_infra_template": "clustertrain.cloud.generate",
    "generate_node_scripts": "clustertrain.cloud.generate",
    "build_infra_template": "clustertrain.cloud.infra",
    "render_infra_template": "clustertrain.cloud.infra",
    "storage_policy_document": "clustertrain.cloud.infra",
    "build_cluster_config": "clustertrain.cloud.pcluster",
    "render_cluster_config": "clustertrain.cloud.pcluster",
    "cloud_findings": "clustertrain.cloud.preflight",
    "cloud_report": "clustertrain.cloud.preflight",
    "validate_file": "clustertrain.cloud.preflight",
    "project_findings": "clustertrain.cloud.project_rules",
    "Finding": "clustertrain.cloud.rules",
    "check_cluster_config": "clustertrain.cloud.rules",
    "model_dirs": "clustertrain.cloud.scripts",
    "render_node_scripts": "clustertrain.cloud.scripts",
    "write_node_scripts": "clustertrain.cloud.scripts",
    "ValidationReport": "clustertrain.cloud.validate",
    "validate_cluster_config": "clustertrain.cloud.validate",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _PUBLIC)
