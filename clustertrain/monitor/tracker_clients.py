"""The two tracker clients :class:`clustertrain.monitor.trackers.TrackerSender` drives from its thread: MLflow
(:class:`MlflowSink`, through ``mlflow.tracking.MlflowClient``) and W&B (:class:`WandbSink`, through ``wandb.init``
and the run object it returns). Each has the same small shape — ``start`` (open or reopen the run), ``send`` (a few
items: metrics rows, notes, checkpoint references), ``finish`` (the end state) — and raises whatever its library
raises; the sender decides what a failure means. Their libraries are imported in ``start``, on the sender's thread,
never on the way to the first step.

Facts they rely on (mlflow 3.17, wandb 0.31, read in the installed packages):

- MLflow's HTTP client reads ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (default 7, exponential backoff: minutes against a
  dead server), ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (default 120 s) at each
  request (``mlflow/environment_variables.py``, ``mlflow/utils/rest_utils.py`` ``http_request``): they are the only
  knobs, process-wide, so :func:`_short_http` sets them (unless the user did) before the client exists.
- ``log_batch`` takes at most 1000 metrics, 100 params and 100 tags per call, 1000 entities in all; a param value at
  most 6000 characters (``mlflow/utils/validation.py``: ``MAX_METRICS_PER_BATCH``, ``MAX_PARAMS_TAGS_PER_BATCH``,
  ``MAX_ENTITIES_PER_BATCH``, ``MAX_PARAM_VAL_LENGTH``); a logged param cannot change its value (a resume on another
  layout records the new value as a tag instead).
- A directory tracking URI is MLflow's file store, which 3.x refuses unless ``MLFLOW_ALLOW_FILE_STORE=true``
  (``mlflow/store/tracking/file_store.py``, "maintenance mode"): the user asked for a directory, so it is set.
  A ``sqlite:`` store puts artifacts under ``./mlruns`` of the process's working directory unless the experiment
  names a location (``mlflow/store/tracking/sqlalchemy_store.py``): the experiment we create gets ``mlartifacts``
  beside the database file.
- MLflow metric points cannot be deleted or rewritten; each point has a step and a timestamp (``mlflow/entities/
  metric.py``). W&B's own ``_step`` must increase within a run, so the x-axis is our ``step`` key
  (``define_metric("*", step_metric="step")``, ``wandb/sdk/wandb_run.py``). ``wandb.init(id=..., resume="allow")``
  continues a run with that id or starts it (``wandb/sdk/wandb_init.py``); offline, each start writes its own
  ``offline-run-<time>-<id>`` directory, all synced into the one run by ``wandb sync``.
- A process's runs share one wandb-core service, whose connection the library keeps in its setup singleton;
  ``wandb.teardown()`` drops it (``wandb/sdk/wandb_setup.py``), so that after the service died the next
  ``wandb.init`` starts a new one (:meth:`WandbSink.recover`).
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: MLflow's HTTP settings for this client: one retry, 5 s per request (a dead server costs seconds, not minutes)
MLFLOW_HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                   "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
MAX_ENTITIES = 1000
MAX_PARAMS = 100
MAX_PARAM_CHARS = 6000
MAX_KEY_CHARS = 250
#: wandb-core writes the run's ``.wandb`` file every this many seconds (its default 15 s; ``wandb/sdk/
#: wandb_settings.py`` ``x_transaction_log_flush_interval``): a killed rank 0 takes wandb-core down with it
#: ("parent process exited ... forced shutdown", without a flush), so this bounds what a SIGKILL loses
WANDB_FLUSH_S = 1.0


@dataclass
class Item:
    """One thing to send: a metrics row (``values``: numeric fields, ``step``), a note (``text``) or a checkpoint
    reference (``text``: its path)."""

    kind: str  # row | note | checkpoint
    step: int | None
    time: float
    values: dict[str, float] = field(default_factory=dict)
    text: str = ""
    note_kind: str = ""

    def line(self) -> str:
        """The note's line in the run's events text."""
        when = f"step {self.step}: " if self.step is not None else ""
        return f"{when}[{self.note_kind or self.kind}] {self.text}"


@dataclass
class RunSpec:
    """What every sink is told about the run."""

    project: str
    model: str
    attempt: int
    params: dict[str, str]  # flat, values as text
    config_text: str | None  # the resolved project file (RUN_DIR/config.yaml)
    run_root: Path


def _short_http() -> None:
    for name, value in MLFLOW_HTTP_ENV.items():
        os.environ.setdefault(name, value)


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def _local_dir(uri: str) -> Path | None:
    """The directory a file-store URI names (``/fsx/mlruns``, ``file:///fsx/mlruns``), else None."""
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" not in uri and not uri.startswith(("sqlite:", "databricks", "postgresql", "mysql", "mssql")):
        return Path(uri)
    return None


class MlflowSink:
    """One MLflow run per model in the project's experiment (see the module docstring)."""

    name = "mlflow"

    def __init__(self, config, spec: RunSpec):
        self.config, self.spec = config, spec
        self.client = None
        self.run_id: str | None = None
        self.events: list[str] = []

    def start(self, previous: dict | None) -> dict:
        _short_http()
        uri = self.config.tracking_uri
        if _local_dir(uri) is not None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import RunStatus
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        spec = self.spec
        run_id = (previous or {}).get("run_id")
        reopened = False
        if run_id:
            try:
                client.get_run(run_id)
                reopened = True
            except Exception:  # the store does not know it (another store): a new run, said in its tags
                run_id = None
        if reopened:
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            experiment_id = client.get_run(run_id).info.experiment_id
        else:
            experiment_id = self._experiment(client)
            tags = {**self.config.tags, "clustertrain.project": spec.project, "clustertrain.model": spec.model}
            run_id = client.create_run(experiment_id, run_name=spec.model, tags=tags).info.run_id
        self.client, self.run_id = client, run_id
        self._params(reopened)
        client.set_tag(run_id, "clustertrain.attempt", str(spec.attempt))
        if spec.config_text is not None:
            client.log_text(run_id, spec.config_text, f"clustertrain/config-attempt{spec.attempt}.yaml")
        url = f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}" if is_server(uri) else None
        note = None if url else f"mlflow ui --backend-store-uri {uri}"
        return {"run_id": run_id, "experiment_id": experiment_id, "url": url, "note": note, "tracking_uri": uri}

    def _experiment(self, client) -> str:
        name = self.config.experiment or self.spec.project
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        uri = self.config.tracking_uri
        location = None
        if uri.startswith("sqlite:///"):
            location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
        try:
            return client.create_experiment(name, artifact_location=location)
        except Exception:  # another model's rank 0 created it first
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _params(self, reopened: bool) -> None:
        from mlflow.entities import Param, RunTag

        have = self.client.get_run(self.run_id).data.params if reopened else {}
        new, changed = [], []
        for key, value in self.spec.params.items():
            key, value = key[:MAX_KEY_CHARS], value[:MAX_PARAM_CHARS]
            if key not in have:
                new.append(Param(key, value))
            elif have[key] != value:  # params are write-once: the new attempt's value is a tag
                changed.append(RunTag(f"clustertrain.attempt{self.spec.attempt}.{key}"[:MAX_KEY_CHARS], value))
        for i in range(0, len(new), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=new[i:i + MAX_PARAMS])
        for i in range(0, len(changed), MAX_PARAMS):
            self.client.log_batch(self.run_id, tags=changed[i:i + MAX_PARAMS])

    def send(self, items: list[Item]) -> None:
        from mlflow.entities import Metric, RunTag

        metrics, tags, notes = [], {}, False
        for item in items:
            stamp = int(item.time * 1000)
            if item.kind == "row":
                metrics += [Metric(k, v, stamp, item.step) for k, v in item.values.items()]
                continue
            notes = True
            self.events.append(item.line())
            if item.kind == "checkpoint":
                tags["clustertrain.checkpoint"] = item.text
                tags["clustertrain.checkpoint_step"] = str(item.step)
            else:
                tags["clustertrain.last_event"] = item.line()[:8000]
                if item.note_kind == "superseded":
                    tags["clustertrain.superseded"] = item.text[:8000]
        for i in range(0, len(metrics), MAX_ENTITIES):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + MAX_ENTITIES])
        if tags:
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        if notes:  # this attempt's notes, rewritten whole (a text artifact cannot be appended to)
            self.client.log_text(self.run_id, "\n".join(self.events) + "\n",
                                 f"clustertrain/events-attempt{self.spec.attempt}.txt")

    def finish(self, state: str) -> None:
        self.client.set_tag(self.run_id, "clustertrain.state", state)
        if state == "RUNNING":  # a reader handed on rows of a run still training (TrackerSender.open(ingest=True))
            return
        status = {"COMPLETED": "FINISHED", "FAILED": "FAILED"}.get(state, "KILLED")  # STOPPED: requeued, reopened
        self.client.set_terminated(self.run_id, status)


class WandbSink:
    """One W&B run per model, grouped by project (see the module docstring)."""

    name = "wandb"

    def __init__(self, config, spec: RunSpec, keep_rows: int = 10_000):
        self.config, self.spec = config, spec
        self.run = None
        self.run_id: str | None = None
        #: the rows this start logged (the latest ``keep_rows``): logged is not yet written (see :meth:`recover`)
        self.kept: deque[Item] = deque(maxlen=keep_rows)

    def directory(self) -> Path:
        return Path(self.config.dir) if self.config.dir else self.spec.run_root

    def held_steps(self, previous: dict | None) -> set[int] | None:
        """Offline: the steps whose rows the run's earlier ``.wandb`` files hold (under this ``dir`` and the one
        ``previous`` names), read before this start writes its own; online: None (the server's history is not read)."""
        run_id = (previous or {}).get("run_id")
        if self.config.mode != "offline" or not run_id:
            return None
        from clustertrain.monitor.wandb_files import held_steps, offline_runs

        dirs = {self.directory()} | ({Path(previous["dir"])} if (previous or {}).get("dir") else set())
        return held_steps([f for d in sorted(dirs) for f in offline_runs(d, run_id)])

    def recover(self) -> list[Item]:
        """The service process died under this start (a Slurm requeue's SIGTERM reaches wandb-core too; the rank
        lived on and got ``ConnectionResetError``): let go of the dead service, start the run again (the same id,
        ``resume="allow"``: a new service, offline a new ``offline-run-*`` directory) and return the kept rows to
        send again — offline those the dead start's ``.wandb`` file does not hold, online all of them (what reached
        the server before the service died is not known: a row may then be there twice, at the same step)."""
        import wandb

        dead = self.run
        held: set[int] = set()
        if dead is not None and self.config.mode == "offline":
            from clustertrain.monitor.wandb_files import held_steps

            held = held_steps([Path(dead.dir).parent / f"run-{self.run_id}.wandb"])
        try:
            wandb.teardown()  # forgets the process's service connection (a dead one) so that init starts another
        except (Exception, SystemExit):
            pass
        rows = [i for i in self.kept if i.step not in held]
        self.kept.clear()
        self.start({"run_id": self.run_id})
        return rows

    def start(self, previous: dict | None) -> dict:
        import wandb

        cfg, spec = self.config, self.spec
        run_id = self.run_id = (previous or {})["run_id"]
        directory = self.directory()
        directory.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False,
                                  x_save_requirements=False, disable_git=True, init_timeout=60,
                                  x_transaction_log_flush_interval=WANDB_FLUSH_S)
        run = wandb.init(project=cfg.project or spec.project, entity=cfg.entity, group=cfg.group or spec.project,
                         name=spec.model, id=run_id, resume="allow", dir=str(directory), mode=cfg.mode,
                         tags=list(cfg.tags), config=dict(spec.params), allow_val_change=True, reinit="create_new",
                         settings=settings)
        run.define_metric("step")
        run.define_metric("*", step_metric="step")
        run.summary["clustertrain/attempt"] = spec.attempt
        if spec.config_text is not None:
            (Path(run.dir) / "clustertrain-config.yaml").write_text(spec.config_text, encoding="utf-8")
        self.run = run
        url = run.url if cfg.mode == "online" else None
        note = None if url else f"offline: wandb sync {directory / 'wandb'}/offline-run-*-{run_id}*"
        return {"run_id": run_id, "url": url, "note": note, "dir": str(directory)}

    def send(self, items: list[Item]) -> None:
        run = self.run
        lines = []
        for item in items:
            if item.kind == "row":
                run.log({"step": item.step, **item.values})
                self.kept.append(item)
                continue
            lines.append(item.line())
            if item.kind == "checkpoint":
                run.summary["clustertrain/checkpoint"] = item.text
                run.summary["clustertrain/checkpoint_step"] = item.step
            else:
                run.summary["clustertrain/last_event"] = item.line()
                if item.note_kind == "superseded":
                    run.summary["clustertrain/superseded"] = item.text
        if lines:  # W&B alerts need the service (online only): a text file in the run's files, synced with it
            with open(Path(run.dir) / "clustertrain-events.txt", "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))

    def finish(self, state: str) -> None:
        self.run.summary["clustertrain/state"] = state
        if state == "STOPPED":
            self.run.mark_preempting()
        self.run.finish(exit_code=1 if state == "FAILED" else 0)


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists and other leaves as JSON text (strings as they are)."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value if isinstance(value, str) else json.dumps(value)}
