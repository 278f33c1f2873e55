"""``tracker_findings(project)``: what ``monitor.trackers`` asks that cannot work, found before any rank starts
(``clustertrain check``'s ``trackers`` and ``secrets`` sections, ``submit``, ``run``). No file is written.

=====================================================  =======  ==================================================
rule                                                   level    path
=====================================================  =======  ==================================================
the tracker's client is not installed where rank 0     error    ``monitor.trackers.mlflow`` / ``.wandb``
runs: this interpreter (``run``, or Slurm without an
image: ``importlib.util.find_spec``); with a container
image built by ``image build`` its pins must hold it
(``tracking:`` of versions.yaml); another image cannot
be looked into from here (warning)
``tracking_uri`` holds ``user:password@``              error    ``monitor.trackers.mlflow.tracking_uri``
a server URL whose ``GET <uri>/health`` does not       error    ``monitor.trackers.mlflow.tracking_uri``
answer 200 within :data:`HEALTH_TIMEOUT_S` (mlflow
3.17 ``mlflow/server/__init__.py`` serves ``/health``)
a file / sqlite store, or W&B's offline ``dir``, off   error    ``...tracking_uri`` / ``...wandb.dir``
the ``aws:`` section's shared mounts (Slurm: rank 0
runs on a compute node)
W&B online with neither ``WANDB_API_KEY`` (nor         error    ``monitor.trackers.wandb``
``WANDB_IDENTITY_TOKEN_FILE``) in the environment nor
a ``.netrc`` entry for W&B's host
a secret-looking tag, or a credential in any string    error    ``monitor.trackers...`` (``secrets`` section)
of the section
=====================================================  =======  ==================================================

W&B online without a key is an error, not a warning: ``wandb.init`` would fail on rank 0's tracker thread, the
run would train for days with one ``tracker_down`` warning and nothing in W&B. W&B reads the key from
``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE`` or the ``.netrc`` file (``NETRC``, else ``~/.netrc``) entry of
its API host (wandb 0.31 ``wandb/sdk/lib/wbauth/authenticate.py``, ``wbnetrc.py``). In a container ``~/.netrc``
is not seen (Pyxis ``--no-container-mount-home``), so there only the variable counts.

The secrets the clients read from the environment (:data:`SECRET_ENV`) reach a container by name only
(:func:`tracker_env_names`, Pyxis ``--container-env``): Pyxis writes ``[ -n "${NAME-}" ] && echo
"NAME=${NAME}"`` for each name, so a name that is not set on the node sets nothing (NVIDIA/pyxis
``pyxis_slurmstepd.c``, ``environ()``, commit 1075199).
"""

from __future__ import annotations

import importlib.util
import netrc
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.core.errors import ClusterTrainError
from clustertrain.core.findings import Finding
from clustertrain.monitor.config import TrackersConfig

if TYPE_CHECKING:
    from clustertrain.project import Project

#: seconds ``GET <tracking_uri>/health`` may take
HEALTH_TIMEOUT_S = 3.0
EXTRA = "pip install 'clustertrain[tracking]'"
#: module to look for, the pin that installs it
PACKAGES = {"mlflow": ("mlflow", "mlflow-skinny"), "wandb": ("wandb", "wandb")}
#: what the clients read from the environment that is a credential, or says where one is (mlflow 3.17
#: ``mlflow/environment_variables.py``; wandb 0.31 ``wandb/env.py``)
SECRET_ENV = {
    "mlflow": ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_AUTH",
               "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_CLIENT_CERT_PATH"),
    "wandb": ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"),
}
#: a secret-looking value: an AWS key id, a private key, a W&B key (40 hex characters), a bearer token
SECRET_VALUE_RE = re.compile(r"(?<![A-Za-z0-9])(AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])|-----BEGIN [A-Z ]*PRIVATE KEY-----"
                             r"|(?<![0-9a-f])[0-9a-f]{40}(?![0-9a-f])|\bBearer\s+\S+|\b(ghp|gho|hf|sk)[-_][A-Za-z0-9]{16,}")
SECRET_NAME_RE = re.compile(r"(SECRET|PASSWORD|PASSWD|TOKEN|PRIVATE_KEY|ACCESS_KEY|API_KEY|CREDENTIAL)", re.IGNORECASE)
FIELD = "monitor.trackers"


def tracker_env_names(trackers: TrackersConfig) -> tuple[str, ...]:
    """The variables a configured tracker's client reads its credentials from: passed into the container by name."""
    names: list[str] = []
    if trackers.mlflow is not None:
        names += SECRET_ENV["mlflow"]
    if trackers.wandb is not None:
        names += SECRET_ENV["wandb"]
    return tuple(names)


def tracker_secret_findings(trackers: TrackersConfig) -> list[Finding]:
    """Credentials written into the section: ``user:password@`` in ``tracking_uri``, secret-looking tags or strings."""
    out: list[Finding] = []
    fix = "remove it: credentials come from the environment (MLflow: MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD " \
          "or MLFLOW_TRACKING_TOKEN; W&B: WANDB_API_KEY or `wandb login`), never from the project file"
    if trackers.mlflow is not None:
        uri = trackers.mlflow.tracking_uri
        if "@" in urllib.parse.urlsplit(uri).netloc:
            out.append(Finding("error", f"{FIELD}.mlflow.tracking_uri", "holds a user name or password (user:password@); "
                               "it would be written into config.yaml, run records and the trackers' parameters",
                               "remove it and export MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
                               "MLFLOW_TRACKING_TOKEN) where you submit"))
    for where, key, value in _strings(trackers):
        if where.endswith(".tracking_uri") and out:
            continue
        if SECRET_VALUE_RE.search(value) or (key is not None and SECRET_NAME_RE.search(key)):
            out.append(Finding("error", where, "looks like a credential; it would be written into config.yaml, the "
                               "run records and every tracker run", fix))
    return out


def _strings(trackers: TrackersConfig) -> list[tuple[str, str | None, str]]:
    """(field, tag name or None, value) of every string the user wrote in the section."""
    out: list[tuple[str, str | None, str]] = []
    if trackers.mlflow is not None:
        m = trackers.mlflow
        out += [(f"{FIELD}.mlflow.tracking_uri", None, m.tracking_uri), (f"{FIELD}.mlflow.experiment", None, m.experiment or "")]
        out += [(f"{FIELD}.mlflow.tags.{k}", k, v) for k, v in m.tags.items()]
    if trackers.wandb is not None:
        w = trackers.wandb
        out += [(f"{FIELD}.wandb.{name}", None, getattr(w, name) or "") for name in ("project", "entity", "group")]
        out += [(f"{FIELD}.wandb.dir", None, str(w.dir or ""))]
        out += [(f"{FIELD}.wandb.tags[{i}]", None, t) for i, t in enumerate(w.tags)]
    return out


def tracker_findings(project: "Project", environ: Mapping[str, str] | None = None, *, secrets: bool = True) -> list[Finding]:
    """Every rule of the module docstring for ``project`` (``secrets=False``: not the credential rules, which
    ``check`` reports in its ``secrets`` section). ``environ``: the submitting environment (default ``os.environ``)."""
    trackers = project.monitor.trackers
    if trackers.mlflow is None and trackers.wandb is None:
        return []
    environ = os.environ if environ is None else environ
    out = tracker_secret_findings(trackers) if secrets else []
    credentials_in_uri = any(f.path.endswith(".tracking_uri") for f in tracker_secret_findings(trackers))
    out += _package_findings(project, trackers)
    if trackers.mlflow is not None and not credentials_in_uri:
        out += _mlflow_findings(project, trackers.mlflow.tracking_uri)
    if trackers.wandb is not None:
        out += _wandb_findings(project, trackers, environ)
    return out


def _in_image(project: "Project") -> bool:
    return project.cluster.backend == "slurm" and bool(project.container_image)


def _package_findings(project: "Project", trackers: TrackersConfig) -> list[Finding]:
    wanted = [name for name in ("mlflow", "wandb") if getattr(trackers, name) is not None]
    out: list[Finding] = []
    if not _in_image(project):
        for name in wanted:
            module, _ = PACKAGES[name]
            if importlib.util.find_spec(module) is None:
                out.append(Finding("error", f"{FIELD}.{name}", f"the {module} package is not installed in this "
                                   "environment (the one rank 0 runs in)", f"{EXTRA} into it"))
        return out
    if project.image is not None and project.cluster.container_image is None:
        try:
            from clustertrain.image.versions import load_versions

            versions = load_versions(project.image.versions)
        except ClusterTrainError:
            return []  # reported by the image section
        pinned = {n.lower() for n in (*versions.python, *versions.tracking)}
        for name in wanted:
            module, pin = PACKAGES[name]
            if pin not in pinned and module not in pinned:
                out.append(Finding("error", f"{FIELD}.{name}", f"the image's pins ({project.image.versions or 'versions.yaml'}) "
                                   f"do not install {pin}, so rank 0 in the container cannot import {module}",
                                   f"add `tracking: {{{pin}: ...}}` to the pins file (as clustertrain's versions.yaml "
                                   "has) and rebuild: `clustertrain image build PROJECT`"))
        return out
    for name in wanted:
        out.append(Finding("warning", f"{FIELD}.{name}", f"runs in cluster.container_image {project.container_image}, "
                           f"which clustertrain did not build: whether it has {PACKAGES[name][0]} is not verified",
                           f"make sure the image has it ({EXTRA}), or build the image with an image: section"))
    return out


def _mlflow_findings(project: "Project", uri: str) -> list[Finding]:
    where = f"{FIELD}.mlflow.tracking_uri"
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme in ("http", "https"):
        return _health_findings(where, uri)
    if parts.scheme == "sqlite":
        path = uri.split("sqlite:///", 1)[1] if uri.startswith("sqlite:///") else ""
        return _shared_findings(project, where, path, "the MLflow database")
    if parts.scheme == "file":
        return _shared_findings(project, where, urllib.parse.unquote(parts.path), "the MLflow directory")
    if not parts.scheme:  # a plain path: MLflow's file store
        return _shared_findings(project, where, uri, "the MLflow directory")
    return []  # databricks, postgresql, mysql...: a service, reached by the client itself


def _health_findings(where: str, uri: str) -> list[Finding]:
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=HEALTH_TIMEOUT_S) as response:
            if response.status == 200:
                return []
            detail = f"HTTP {response.status}"
    except urllib.error.HTTPError as e:
        detail = f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        detail = str(getattr(e, "reason", e))
    return [Finding("error", where, f"the MLflow server does not answer (GET {url}: {detail})",
                    "start it (`mlflow server --host 0.0.0.0 --port 5000`) or correct the URL; every node must reach it")]


def _shared_findings(project: "Project", where: str, path: str, what: str) -> list[Finding]:
    if not path:
        return []
    if project.cluster.backend == "slurm" and not Path(path).is_absolute():
        return [Finding("error", where, f"{what} {path!r} is a relative path; rank 0 runs on a compute node in the "
                        "run directory", "give an absolute path on a shared file system, e.g. /fsx/mlruns")]
    if project.cluster.backend != "slurm" or project.aws is None:
        return []
    from clustertrain.core.storage_layout import off_mount_problems

    off = [m for f, m in off_mount_problems(project, extra={where: path}) if f == where]
    if off:
        return [Finding("error", where, f"{what}: {off[0]}", "put it on a shared file system of the aws: section "
                        "(e.g. <mount>/mlruns), or use an MLflow server URL" if "mlflow" in where else
                        "put it on a shared file system of the aws: section (e.g. <mount>/wandb), or leave it unset "
                        "(the model's run directory)")]
    return []


def _wandb_findings(project: "Project", trackers: TrackersConfig, environ: Mapping[str, str]) -> list[Finding]:
    w = trackers.wandb
    assert w is not None
    where = f"{FIELD}.wandb"
    if w.mode == "offline":
        return _shared_findings(project, f"{where}.dir", str(w.dir), "W&B's offline directory") if w.dir else []
    if w.dir is not None:
        out = _shared_findings(project, f"{where}.dir", str(w.dir), "W&B's run directory")
    else:
        out = []
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return out
    if not _in_image(project) and _netrc_has(environ):
        return out
    fix = ("export WANDB_API_KEY where you submit (it is passed into the job by name, never written), or set "
           "monitor.trackers.wandb.mode: offline")
    if _in_image(project):
        return out + [Finding("error", where, "mode online but WANDB_API_KEY is not set (a ~/.netrc login is not seen "
                              "inside the container: HOME is not mounted)", fix)]
    return out + [Finding("error", where, "mode online but there is no W&B API key: WANDB_API_KEY is not set and "
                          "~/.netrc has no entry for W&B's host", fix + ", or run `wandb login`")]


def _netrc_has(environ: Mapping[str, str]) -> bool:
    host = urllib.parse.urlsplit(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(environ["NETRC"]) if environ.get("NETRC") else Path(environ.get("HOME") or Path.home()) / ".netrc"
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
