"""The cloud stage: AWS ParallelCluster config, CloudFormation infrastructure and node scripts,
generated from the project file and validated offline (no AWS calls).

Public API:
    AwsConfig                                  the project file's ``aws:`` section (config.py)
    build_cluster_config, render_cluster_config   ParallelCluster 3 config as a dict / YAML (pcluster.py)
    validate_cluster_config, validate_file, ValidationReport, Finding   pcluster schema + pure validators + our rules (validate.py)
    check_cluster_config                       our own rules only (rules.py; boot phases in phases.py)
    cloud_findings, cloud_report               the stage's preflight for `clustertrain check` (preflight.py)
    project_findings                           project-level aws: checks as findings (project_rules.py)
    build_infra_template, render_infra_template, storage_policy_document  CloudFormation, node IAM policy (infra.py)
    render_node_scripts, write_node_scripts, model_dirs   node setup scripts (scripts.py)
    generate_cluster_config, generate_infra_template, generate_node_scripts   build, check, write (generate.py)
    load_catalog, InstanceCatalog, InstanceFacts  instance facts (catalog.py)

Modules here never import clustertrain.project at import time (project.py imports cloud.config).
"""

from clustertrain.cloud.catalog import InstanceCatalog, InstanceFacts, load_catalog
from clustertrain.cloud.config import AwsConfig
from clustertrain.cloud.generate import generate_cluster_config, generate_infra_template, generate_node_scripts
from clustertrain.cloud.infra import build_infra_template, render_infra_template, storage_policy_document
from clustertrain.cloud.pcluster import build_cluster_config, render_cluster_config
from clustertrain.cloud.preflight import cloud_findings, cloud_report
from clustertrain.cloud.project_rules import project_findings
from clustertrain.cloud.rules import Finding, check_cluster_config
from clustertrain.cloud.scripts import model_dirs, render_node_scripts, write_node_scripts
from clustertrain.cloud.validate import ValidationReport, validate_cluster_config, validate_file

__all__ = [
    "AwsConfig", "Finding", "InstanceCatalog", "InstanceFacts", "ValidationReport",
    "build_cluster_config", "build_infra_template", "check_cluster_config", "cloud_findings", "cloud_report",
    "generate_cluster_config", "project_findings", "storage_policy_document",
    "generate_infra_template", "generate_node_scripts", "load_catalog", "model_dirs", "render_cluster_config",
    "render_infra_template", "render_node_scripts", "validate_cluster_config", "validate_file", "write_node_scripts",
]
