"""Validate a ParallelCluster config offline: aws-parallelcluster's own schema and pure validators
(when installed) plus our rules, merged into one finding per problem.

The schema is ``pcluster.schemas.cluster_schema.ClusterSchema(...).load(config)``: pure marshmallow,
no AWS calls. On the loaded config we run ParallelCluster's validators that make no AWS call
(:mod:`clustertrain.cloud.pcluster_validators`). Messages become :class:`~clustertrain.core.findings.Finding`
objects with the same YAML paths as ours; :func:`merge_findings` keeps one per problem.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


from clustertrain.cloud.catalog import InstanceCatalog
from clustertrain.cloud.rules import Finding, check_cluster_config
from clustertrain.core.errors import ConfigError
from clustertrain.core.schema import read_yaml, require_mapping

SCHEMA_FIXES = {
    "Unknown field.": "remove it or move it where it belongs (see the ParallelCluster 3 configuration reference)",
    "Missing data for required field.": "add it",
    "String does not match expected pattern.": "use a real AWS id (e.g. subnet-0123456789abcdef0)",
}


@dataclass
class ValidationReport:
    findings: list[Finding] = field(default_factory=list)
    schema_ran: bool = False
    schema_note: str = ""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors


def schema_available() -> bool:
    try:
        import pcluster.schemas.cluster_schema  # noqa: F401
    except ImportError:
        return False
    return True


# Loading the schema builds pcluster's config object, whose constructor tries to cache
# describe_capacity_reservations (it catches the failure). Inside this context boto3 finds no
# credentials and no endpoint, so that attempt fails before any request leaves the machine.
_OFFLINE_ENV = {
    "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None, "AWS_PROFILE": None,
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": None, "AWS_CONTAINER_CREDENTIALS_FULL_URI": None,
    "AWS_WEB_IDENTITY_TOKEN_FILE": None, "AWS_ROLE_ARN": None,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
}


@contextlib.contextmanager
def offline_aws(region: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in [*_OFFLINE_ENV, "AWS_DEFAULT_REGION"]}
    for k, v in {**_OFFLINE_ENV, "AWS_DEFAULT_REGION": region}.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_with_pcluster(config: dict[str, Any]) -> tuple[Any, list[Finding]] | None:
    """aws-parallelcluster's schema load, offline: (loaded config or None, schema findings); None when not installed."""
    if not schema_available():
        return None
    import marshmallow
    from pcluster.aws.aws_api import AWSApi
    from pcluster.schemas.cluster_schema import ClusterSchema

    region = config.get("Region") if isinstance(config.get("Region"), str) else "us-east-1"
    with offline_aws(region):
        AWSApi.reset()
        try:
            return ClusterSchema(cluster_name="clustertrain-check").load(config), []
        except marshmallow.ValidationError as err:
            return None, list(_flatten(err.messages, ()))
        except Exception as err:  # noqa: BLE001 - pcluster's post-load hooks raise plain errors on malformed input
            return None, [Finding("error", "(file)", f"aws-parallelcluster could not load the config: {err}", "fix the reported key",
                                  source="aws-parallelcluster")]
        finally:
            AWSApi.reset()


def schema_findings(config: dict[str, Any]) -> list[Finding] | None:
    """aws-parallelcluster's schema check as findings; None when aws-parallelcluster is not installed."""
    loaded = load_with_pcluster(config)
    return None if loaded is None else loaded[1]


def pcluster_findings(config: dict[str, Any]) -> list[Finding] | None:
    """Schema, then (when the schema accepts the config) pcluster's pure offline validators; None when not installed."""
    loaded = load_with_pcluster(config)
    if loaded is None:
        return None
    obj, found = loaded
    if obj is not None:
        from clustertrain.cloud.pcluster_validators import validator_findings

        region = config.get("Region") if isinstance(config.get("Region"), str) else "us-east-1"
        with offline_aws(region):
            found = found + validator_findings(obj, config)
    return found


#: a schema path that reports the same problem as one of our rules at another path
SAME_PROBLEM = {"Scheduling.SlurmQueues": "SlurmQueues"}


def merge_findings(findings: list[Finding]) -> list[Finding]:
    """One finding per problem. Where aws-parallelcluster and clustertrain report the same path (or a path of
    :data:`SAME_PROBLEM`) at the same level, clustertrain's finding stays (it names the value and the fix) and its
    ``source`` names both; exact repeats go. Order is kept."""
    ours = {(f.path, f.level) for f in findings if f.source == "clustertrain"}

    def key(f: Finding) -> tuple[str, str]:
        alias = SAME_PROBLEM.get(f.path)
        return (alias, f.level) if alias and (alias, f.level) in ours else (f.path, f.level)

    confirmed = {key(f) for f in findings if f.source != "clustertrain" and key(f) in ours}
    out: list[Finding] = []
    seen: set[tuple[str, str, str]] = set()
    for f in findings:
        if f.source != "clustertrain" and key(f) in ours:
            continue
        if f.source == "clustertrain" and (f.path, f.level) in confirmed:
            f = replace(f, source="clustertrain, aws-parallelcluster")
        if (f.level, f.path, f.message) not in seen:
            seen.add((f.level, f.path, f.message))
            out.append(f)
    return out


def _flatten(messages: Any, path: tuple) -> Any:
    if isinstance(messages, dict):
        for key, value in messages.items():
            if key == "_schema":
                yield from _flatten(value, path)
            else:
                yield from _flatten(value, path + (int(key) if isinstance(key, str) and key.isdigit() else key,))
    elif isinstance(messages, list) and messages and all(isinstance(m, str) for m in messages):
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(top level)"
        for m in messages:
            fix = SCHEMA_FIXES.get(m, "see the ParallelCluster 3 configuration reference")
            if m == "Unknown field." and path and path[-1] == "SlurmQueues":
                fix = "move SlurmQueues under Scheduling"
            if m.startswith("Must be one of") and path and path[-1] == "Os":
                fix = "use alinux2023 or ubuntu2204 (alinux2 is not supported by ParallelCluster 3.16)"
            yield Finding("error", where, f"schema: {m.rstrip('.')}", fix, source="aws-parallelcluster")
    elif isinstance(messages, list):
        for i, value in enumerate(messages):
            yield from _flatten(value, path + (i,))
    else:
        yield from _flatten([str(messages)], path)


def validate_cluster_config(config: dict[str, Any], use_schema: bool = True, catalog: InstanceCatalog | None = None) -> ValidationReport:
    """aws-parallelcluster's schema and pure validators (if installed and asked for) plus our rules, one finding per problem."""
    report = ValidationReport()
    found: list[Finding] = []
    if use_schema:
        theirs = pcluster_findings(config)
        if theirs is None:
            report.schema_note = (
                "aws-parallelcluster is not installed: only clustertrain's own rules ran "
                "(pip install 'clustertrain[aws]' adds ParallelCluster's schema and offline validators)"
            )
        else:
            report.schema_ran = True
            found += theirs
    else:
        report.schema_note = "ParallelCluster's schema and validators were skipped: only clustertrain's own rules ran"
    report.findings = merge_findings(found + check_cluster_config(config, catalog))
    return report


def read_cluster_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found; pass a ParallelCluster config or a clustertrain project file")
    return require_mapping(read_yaml(path), path, "a ParallelCluster config (a mapping with Region, Image, HeadNode, "
                           "Scheduling...) or a clustertrain project")


def is_project(raw: dict[str, Any]) -> bool:
    return "models" in raw and "HeadNode" not in raw and "Scheduling" not in raw
