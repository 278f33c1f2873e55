"""``clustertrain check PROJECT``: one preflight that joins the stages.

Each stage owns the rules about what it reads and returns :class:`~clustertrain.core.findings.Finding`
objects; this module only gathers them, in pipeline order, into one :class:`CheckReport`:

=================  ==========================================================================
section            what it checks (owner)
=================  ==========================================================================
layout             every path a job reads or writes is on a shared file system of the
                   ``aws:`` section (:mod:`clustertrain.core.storage_layout`)
cluster            ParallelCluster schema, pcluster's own offline validators and our rules on
                   the generated config; project-level ``aws:`` checks (:mod:`clustertrain.cloud.preflight`),
                   e.g. ``min_count`` below ``max_count`` on a targeted reservation
plan               each model is feasible with its ``parallelism`` layout (:mod:`clustertrain.plan.preflight`);
                   warnings: plan tokens vs steps x batch x sequence, identical models, no warmup at a
                   large model's learning rate (:mod:`clustertrain.plan.model_rules`)
framework          what Megatron-LM would reject for a ``framework: megatron`` model: GPUs, batch vs dp,
                   tokenizer, extra arguments, the image's Megatron-LM (:mod:`clustertrain.megatron.rules`)
data               data source present or publishable, tokenizer loadable, ``model.vocab`` matches it
                   (:mod:`clustertrain.data.preflight`)
init_from          a ``training.init_from`` Hugging Face directory: present, its config.json describes ``model:``,
                   its vocabulary and tokenizer are ``data.tokenizer``'s (:mod:`clustertrain.train.init_from_check`)
image              the training image's pins load and work together by the compatibility table
                   (:mod:`clustertrain.image.preflight`)
launch             interpreter or image available on every node, time limit vs checkpoint
                   interval vs the stop signal (:mod:`clustertrain.launch.preflight`), the job chain
                   (``launch.max_segments`` x time limit) vs ``max_steps`` (:mod:`clustertrain.launch.segments`)
trackers           ``monitor.trackers``: the clients installed where rank 0 runs (or in the image's pins),
                   the MLflow server answers, file stores and W&B's directory on a shared mount, a W&B key
                   (:mod:`clustertrain.monitor.tracker_preflight`)
secrets            nothing generated (batch scripts, cluster config, infrastructure template,
                   node scripts, the image's Dockerfile and versions.json) holds a credential or private key;
                   no credential in ``monitor.trackers`` (``user:password@`` in ``tracking_uri``, secret tags)
=================  ==========================================================================

No section calls AWS or writes a file. A section that cannot run (say aws-parallelcluster is not
installed) adds a note, never a silent pass. ``submit``, ``cluster config`` and ``validate suite``
call :func:`require_clean` first and refuse on errors.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clustertrain.core.errors import ClusterTrainError, ConfigError
from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.project import Project

SECRET_RE = re.compile(r"(?<![A-Z0-9])(AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])|-----BEGIN [A-Z ]*PRIVATE KEY-----")
SECRET_NAME_RE = re.compile(r"(SECRET|PASSWORD|PASSWD|TOKEN|PRIVATE_KEY|ACCESS_KEY|API_KEY|CREDENTIAL)", re.IGNORECASE)


@dataclass
class CheckReport:
    project: str
    findings: list[tuple[str, Finding]] = field(default_factory=list)  # (section, finding)
    sections: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[tuple[str, Finding]]:
        return [(s, f) for s, f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[tuple[str, Finding]]:
        return [(s, f) for s, f in self.findings if f.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict:
        return {
            "project": self.project, "ok": self.ok, "sections": self.sections, "notes": self.notes,
            "findings": [{"section": s, "level": f.level, "path": f.path, "message": f.message, "fix": f.fix,
                          "source": f.source} for s, f in self.findings],
        }


def layout_findings(project: "Project") -> list[Finding]:
    from clustertrain.core.storage_layout import off_mount_problems

    return [Finding("error", where, message, "put it on a shared file system of the aws: section")
            for where, message in off_mount_problems(project)]


def secret_findings(project: "Project") -> list[Finding]:
    """Render what clustertrain would write for this project and look for credentials in it."""
    out: list[Finding] = []
    launch = project.launch
    for name, value in launch.env.items():
        if value and (SECRET_NAME_RE.search(name) or SECRET_RE.search(value)):
            out.append(Finding("error", f"launch.env.{name}", "looks like a credential; it would be written in clear into "
                               "every batch script and job record", "remove it: nodes get AWS access from the instance "
                               "role, other secrets from a file readable only by the job's user"))
    from clustertrain.monitor.tracker_preflight import tracker_secret_findings

    out += tracker_secret_findings(project.monitor.trackers)
    for where, text in _generated(project):
        if SECRET_RE.search(text):
            out.append(Finding("error", where, "the generated file holds what looks like an AWS access key or a private key",
                               "remove the credential from the project file; credentials come from the instance role"))
    return out


def _generated(project: "Project") -> list[tuple[str, str]]:
    """(what, text) of every file clustertrain generates for ``project`` that can be rendered offline."""
    texts: list[tuple[str, str]] = []
    if project.cluster.backend == "slurm":
        try:
            from clustertrain.launch.prepare import default_run_dir
            from clustertrain.launch.sbatch import build_request, render_script

            for entry in project.models:
                request = build_request(project, entry, default_run_dir(project, entry))
                texts.append((f"batch script of {entry.name}", render_script(request)))
        except ClusterTrainError:
            pass  # reported by the launch section
    if project.aws is not None:
        try:
            from clustertrain.cloud.infra import build_infra_template, render_infra_template
            from clustertrain.cloud.pcluster import build_cluster_config, render_cluster_config
            from clustertrain.cloud.scripts import render_node_scripts

            texts.append(("cluster config", render_cluster_config(build_cluster_config(project), project.name)))
            texts.append(("infrastructure template", render_infra_template(build_infra_template(project), project.name)))
            texts += [(f"node script {name}", text) for name, text in render_node_scripts(project).items()]
        except ClusterTrainError:
            pass  # reported by the cluster section
    if project.image is not None:
        try:
            from clustertrain import __version__
            from clustertrain.image.paths import image_ref
            from clustertrain.image.recipe import dockerfile_text, versions_json_text
            from clustertrain.image.versions import load_versions

            ref, versions = image_ref(project), load_versions(project.image.versions)
            pins = str(project.image.versions or "")
            texts.append(("image Dockerfile", dockerfile_text(versions, megatron=ref.megatron, clustertrain_version=__version__,
                                                              wheel_name=f"clustertrain-{__version__}-py3-none-any.whl")))
            texts.append(("image versions.json", versions_json_text(versions, reference=ref.reference, megatron=ref.megatron,
                                                                    notes=[], pins_file=pins)))
        except ClusterTrainError:
            pass  # reported by the image section
    return texts


def _sections() -> list[tuple[str, Callable[["Project"], list[Finding]]]]:
    from clustertrain.cloud.preflight import cloud_findings
    from clustertrain.data.preflight import data_findings
    from clustertrain.image.preflight import image_findings
    from clustertrain.launch.preflight import launch_findings
    from clustertrain.megatron.rules import framework_findings
    from clustertrain.monitor.tracker_preflight import tracker_findings
    from clustertrain.plan.preflight import plan_findings
    from clustertrain.train.init_from_check import init_from_findings

    return [("layout", layout_findings), ("cluster", cloud_findings), ("plan", plan_findings),
            ("framework", framework_findings), ("data", data_findings), ("init_from", init_from_findings),
            ("image", image_findings), ("launch", launch_findings),
            ("trackers", lambda p: tracker_findings(p, secrets=False)), ("secrets", secret_findings)]


def run_check(project: "Project", only: list[str] | None = None) -> CheckReport:
    """Every section's findings for ``project`` (``only``: just these sections)."""
    report = CheckReport(project.name)
    for name, check in _sections():
        if only and name not in only:
            continue
        try:
            found = check(project)
        except ClusterTrainError as err:  # a section that stops on a user mistake still reports it
            found = [Finding("error", name, str(err), "fix the field it names")]
        report.sections.append(name)
        report.findings += [(name, f) for f in found]
    if project.aws is None:
        report.notes.append("no aws: section: the cluster checks (ParallelCluster config, shared file systems, IAM) did not run")
    return report


def _about_other_model(path: str, project: "Project", keep: list[str]) -> bool:
    for i, m in enumerate(project.models):
        if m.name not in keep and (path.startswith(f"models[{i}]") or path.startswith(f"models.{m.name}.")):
            return True
    return False


#: the sections each action refuses on: a cluster can be built while a model's plan is still infeasible
#: (that is fixed in the project file, not by recreating the cluster); a job cannot be submitted.
GATES = {
    "submit": None,
    "cluster config": ["layout", "cluster", "secrets"],
    "cluster create": ["layout", "cluster", "secrets"],
    "cluster update": ["layout", "cluster", "secrets"],
    "validate suite": ["layout", "cluster", "launch", "secrets"],
}


def require_clean(project: "Project", action: str, models: list[str] | None = None) -> CheckReport:
    """Run the check before ``action`` (its sections: :data:`GATES`); raise one line naming the first
    error (and how many more). ``models``: only these models are acted on; errors about the others do not block."""
    report = run_check(project, only=GATES.get(action))
    errors = [(s, f) for s, f in report.errors if not (models and _about_other_model(f.path, project, models))]
    if errors:
        section, first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        sets = [a for item in project.overrides for a in ("--set", item)]
        check = shlex.join(["clustertrain", "check", *([str(project.file), *sets] if project.file else [])])
        raise ConfigError(f"{action} refused: {first.path}: {first.message}; fix: {first.fix}{more}; "
                          f"run `{check}` for the full list")
    return report
