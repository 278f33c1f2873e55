"""Monitoring overhead: tokens/s with the node sampler (1 s interval) and per-rank step timing on, divided by
tokens/s with both off (``monitor.enabled: false``); and the experiment trackers' cost (issue 41): step time with
MLflow (a real ``mlflow server`` on 127.0.0.1) and W&B (offline) on, and with the MLflow server stopped mid-run,
divided by the step time of the same run with the trackers off. All measured side by side in one run.

    flock /tmp/ct-heavy.lock .venv/bin/python bench/monitor_overhead.py [--rounds 3] [--steps 80] [--procs 2]
    .venv/bin/python bench/monitor_overhead.py --smoke     # 1 rank, a tiny model, a few steps, one round

Sides, each a real ``clustertrain run`` (gloo ranks on this machine), same project, same seed:

- ``off``: ``monitor.enabled: false``;
- ``on``: the monitor on, no tracker (the reference of the tracker figures: "trackers off");
- ``trackers``: the monitor on plus ``monitor.trackers.mlflow`` (``tracking_uri: http://127.0.0.1:PORT``, one server
  started for the bench: ``mlflow server --workers 1`` on a SQLite store, its job runner off with
  ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``) and ``monitor.trackers.wandb`` (``mode: offline``, in the run dir);
- ``down``: the monitor on plus MLflow only, to a server of its own that the bench kills (SIGKILL to its process
  group) as soon as the run's ``trackers.json`` shows MLflow took its first rows: the server stops answering
  mid-run (connection refused from then on). The bench checks that training still finishes, every step is in
  ``metrics.jsonl`` and the run recorded exactly one ``tracker_down`` warning event.

Each round runs every side once, the order alternating between rounds (bench/harness.py ``interleave``).
Tokens/s of a run is the median of metrics.jsonl's ``tokens_per_s`` after the first ``--warmup`` logged steps. The
step time of a run is the wall time from the first logged step after the warm-up to the last one (the rows' ``time``)
divided by the steps between them: it includes every stall of the step path (a tracker blocking a step for one 5 s
HTTP timeout shows in it; a median of per-step times would hide it).

Targets. Monitor on / off tokens/s >= 0.99 (the verdict says "inconclusive" when some rounds meet it and some do
not: the run-to-run noise of this machine, about ±3%, is larger than the 1% asked about). Trackers on / off and
server down / off step time <= 1.05: the issue asks for "unchanged within noise" — the senders only enqueue on the
step path (clustertrain/monitor/trackers.py), so any cost is CPU taken from the ranks by the sender thread, the
libraries' imports and W&B's ``wandb-core`` process; 1.05 is the edge of this machine's run-to-run noise (±3%, plus
the tracker sides' own processes: on a 2-core machine the MLflow server itself, wandb-core and the sender share the
ranks' two cores, which a GPU node with 96+ cores and a remote server does not). A stall of the step path would be
far outside it. On a 2-core machine the sampler too shares the cores with the ranks, which is harsher than a GPU
node, where the ranks' work is on the GPUs.

Server start: the bench prints how long ``mlflow server`` took to answer ``/health`` (~5-6 s here, two Python
processes importing MLflow; with the job runner on, ~8 s and seven more processes). Smoke mode starts one server for
both tracker sides, beside the first sides (the ``down`` side runs last and kills it), and slows the ``down`` side's
rank 0 by 0.6 s a step (``CLUSTERTRAIN_INJECT_SLOW_DATA``) so that the server stops while the run is still going:
smoke figures are not judged.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from harness import ROOT, Bench, Ratio, interleave

PROJECT = """
name: bench
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: {procs}, threads_per_worker: 1}}
storage: {{root: {root}}}
monitor: {{enabled: {enabled}, interval_s: 1{trackers}}}
models:
  - name: m
    model: {{layers: {layers}, hidden: {hidden}, heads: 4, seq_len: {seq}}}
    training: {{max_steps: {steps}, micro_batch: 8, global_batch: {gb}, checkpoint_every: 100000, log_every: {log_every},
               seed: 1}}
"""
MLFLOW_BIN = Path(sys.executable).parent / "mlflow"
#: smoke only: the down side's rank 0 sleeps this long a step (16 tiny steps would end before MLflow's first rows)
SMOKE_DOWN_SLOW = "0:0.6"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 (its own process group, so that stopping it stops its workers too)."""

    def __init__(self, workdir: Path, name: str):
        self.dir = workdir / name
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.t0 = time.perf_counter()
        self.start_s: float | None = None
        self.log = open(self.dir / "server.log", "wb")
        self.proc = subprocess.Popen(
            [str(MLFLOW_BIN), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.dir / 'mlflow.db'}", "--artifacts-destination",
             str(self.dir / "artifacts")], cwd=self.dir, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def ready(self) -> "MlflowServer":
        """Wait until the server answers ``/health`` (once); ``start_s``: seconds from its start to then."""
        if self.start_s is not None:
            return self
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.perf_counter() - self.t0 > 120:
                self.stop()
                sys.exit(f"mlflow server did not start (see {self.dir / 'server.log'})")
            time.sleep(0.1)
        self.start_s = time.perf_counter() - self.t0
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server's process group (``sig``), then make sure it is gone."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers left behind by a SIGTERM
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


def trackers_yaml(mlflow_uri: str | None, wandb: bool) -> str:
    parts = []
    if mlflow_uri:
        parts.append(f"mlflow: {{tracking_uri: {json.dumps(mlflow_uri)}, experiment: bench-monitor-overhead}}")
    if wandb:
        parts.append("wandb: {project: bench-monitor-overhead, mode: offline}")
    return f", trackers: {{tensorboard: true, {', '.join(parts)}}}" if parts else ""


def mlflow_sent(run_dir: Path) -> bool:
    try:
        entry = json.loads((run_dir / "trackers.json").read_text())["trackers"]["mlflow"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return (entry.get("sent_step") or 0) >= 1


def measure(workdir: Path, size: dict, tag: str, enabled: bool = True, trackers: str = "",
            stop_server: MlflowServer | None = None, slow: str = "") -> dict[str, float]:
    """One ``clustertrain run``: its median tokens/s and its wall time per step, both after the warm-up rows.
    ``stop_server``: kill that server (SIGKILL) once the run's MLflow tracker took its first rows. ``slow``: rank 0
    sleeps in its data path every step (``CLUSTERTRAIN_INJECT_SLOW_DATA``, ``RANK:SECONDS``)."""
    project = workdir / f"{tag}.yaml"
    project.write_text(PROJECT.format(root=json.dumps(str(workdir / "fsx")), enabled=str(enabled).lower(),
                                      trackers=trackers, **size))
    run_dir = workdir / tag
    env = dict(os.environ)
    if slow:
        env["CLUSTERTRAIN_INJECT_SLOW_DATA"] = slow
    proc = subprocess.Popen([sys.executable, "-m", "clustertrain", "run", str(project), "--run-dir", str(run_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped_at_step = None
    if stop_server is not None:
        while proc.poll() is None and not mlflow_sent(run_dir):
            time.sleep(0.1)
        if proc.poll() is None:
            stop_server.stop(signal.SIGKILL)
            done = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
            stopped_at_step = done[-1]["step"] if done else 0
    out, err = proc.communicate()
    if proc.returncode:
        sys.exit(f"`clustertrain run` failed (exit {proc.returncode}):\n{out[-2000:]}\n{err[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    if not steps or steps[-1] != size["steps"] or steps != sorted(set(steps)):
        sys.exit(f"{run_dir}: metrics.jsonl does not end at step {size['steps']} with each step once: {steps}")
    if enabled and not list((run_dir / "timing").glob("rank*.jsonl")):
        sys.exit(f"{run_dir}: the monitor was on but no per-rank timing was written")
    if enabled and not size["smoke"] and not list((run_dir / "monitor").glob("*.csv")):
        sys.exit(f"{run_dir}: the monitor was on but the node sampler wrote nothing")
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()] \
        if (run_dir / "events.jsonl").is_file() else []
    down = [e for e in events if e.get("kind") == "tracker_down"]
    if stop_server is not None:
        if stopped_at_step is None or stopped_at_step >= size["steps"]:
            sys.exit(f"{run_dir}: the MLflow server was not stopped mid-run (the run ended first)")
        if len(down) != 1 or down[0].get("severity") != "warning":
            sys.exit(f"{run_dir}: expected one tracker_down warning after the server stopped, got {down}")
    elif trackers:
        if down:
            sys.exit(f"{run_dir}: a tracker went down with its server up: {down}")
        if not mlflow_sent(run_dir):
            sys.exit(f"{run_dir}: MLflow took no rows")
    measured = rows[size["warmup"]:] if len(rows) > size["warmup"] + 1 else rows
    step_s = (measured[-1]["time"] - measured[0]["time"]) / max(1, measured[-1]["step"] - measured[0]["step"])
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in measured), "step_s": step_s}


def main() -> int:
    bench = Bench("monitor_overhead", __doc__, rounds=3)
    bench.parser.add_argument("--steps", type=int, default=80)
    bench.parser.add_argument("--procs", type=int, default=2)
    bench.parser.add_argument("--hidden", type=int, default=256)
    bench.parser.add_argument("--log-every", type=int, default=5)
    bench.parser.add_argument("--warmup", type=int, default=2, help="logged steps left out at the start")
    args = bench.parse()
    if bench.smoke:
        size = dict(procs=1, layers=1, hidden=32, seq=32, steps=16, gb=8, log_every=1, warmup=1)
    else:
        size = dict(procs=args.procs, layers=4, hidden=args.hidden, seq=128, steps=args.steps, gb=8 * args.procs,
                    log_every=args.log_every, warmup=args.warmup)
    size["smoke"] = bench.smoke
    with tempfile.TemporaryDirectory(prefix="ct-monitor-overhead-") as tmp:
        work = Path(tmp)
        count = iter(range(10**6))
        servers: list[MlflowServer] = []
        try:
            # the shared server starts now; smoke runs the first sides while it starts (its figures mean nothing),
            # a measured run waits for it first
            shared = MlflowServer(work, "server-shared")
            servers.append(shared)
            if not bench.smoke:
                print(f"mlflow server answered /health {shared.ready().start_s:.1f} s after its start", flush=True)

            def down_side() -> dict[str, float]:
                server = shared if bench.smoke else MlflowServer(work, f"server-{next(count)}")
                if server is not shared:
                    servers.append(server)
                server.ready()
                return measure(work, size, f"down-{next(count)}", trackers=trackers_yaml(server.uri, False),
                               stop_server=server, slow=SMOKE_DOWN_SLOW if bench.smoke else "")

            sides = {"off": lambda: measure(work, size, f"off-{next(count)}", enabled=False),
                     "on": lambda: measure(work, size, f"on-{next(count)}"),
                     "trackers": lambda: measure(work, size, f"trackers-{next(count)}",
                                                 trackers=trackers_yaml(shared.ready().uri, True)),
                     "down": down_side}
            results = {name: [] for name in sides}
            for name, values in interleave({n: (lambda f=f, n=n: results[n].append(f()) or 0.0)
                                            for n, f in sides.items()}, bench.rounds).items():
                assert len(values) == len(results[name])
            if bench.smoke:
                print(f"mlflow server answered /health {shared.start_s:.1f} s after its start (started beside the "
                      "first sides)", flush=True)
        finally:
            for server in servers:
                server.stop()
    tps = {n: [r["tokens_per_s"] for r in v] for n, v in results.items()}
    step = {n: [r["step_s"] for r in v] for n, v in results.items()}
    for name in sides:
        print(f"{name}: tokens/s " + ", ".join(f"{v:,.0f}" for v in tps[name])
              + "; s/step " + ", ".join(f"{v:.4f}" for v in step[name]))
    what = f"{size['procs']} gloo rank(s), {size['steps']} steps"
    bench.report(Ratio.of("monitor on / off, tokens/s", tps["on"], tps["off"], at_least=0.99,
                          note=f"{what}, sampler every 1 s, per-rank timing every {size['log_every']} step(s)"))
    bench.report(Ratio.of("trackers on / off, step time", step["trackers"], step["on"], at_most=1.05,
                          note=f"{what}, MLflow server on 127.0.0.1 + W&B offline vs the monitor without trackers"))
    bench.report(Ratio.of("MLflow server stopped mid-run / trackers off, step time", step["down"], step["on"],
                          at_most=1.05, note=f"{what}, server killed after MLflow's first rows; one tracker_down "
                                             "warning, training finished"))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
