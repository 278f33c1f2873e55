"""The HTML run report from run directories synthesized in the documented formats (metrics.jsonl, timing/rank<R>.jsonl,
monitor/<node>.csv, events.jsonl, usage.json, checkpoints/step_*/meta.json): every figure is a decodable, non-blank
PNG of the promised size, the tables say what the files hold, and missing or damaged parts are marked, never fatal.

No GPU exists here: the CSV with GPU columns below stands in for one (rows as the sampler writes them from NVML)."""

from __future__ import annotations

import base64
import csv
import io
import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from clustertrain.cli import app
from clustertrain.core.errors import ConfigError, RunDirError
from clustertrain.monitor import plots
from clustertrain.core.run_events import Attempt, Event, Usage, append_event, read_timing, write_usage
from clustertrain.monitor.report import gather, render_html, slowest_rank, write_report
from clustertrain.monitor.samples import HOST_ONLY, WITH_GPUS, format_timestamp
from clustertrain.project import dump_project
from clustertrain.resolve import load_project
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import RunInfo, RunStatus, write_record, write_status_record
from clustertrain.core.states import State

T0 = 1795000000.0
PRICE = 34.60  # per p5e.48xlarge node-hour (8 GPUs) -> 4.325 per GPU-hour
GPU_PROJECT = """name: rep
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 8, instance_type: p5e.48xlarge, partition: gpu}}
storage: {{root: {root}, region: ap-southeast-3}}
plan:
  price: {{per_hour: {price}, region: ap-southeast-3, date: "2026-11-01", kind: quote}}
models:
  - name: alpha
    model: {{layers: 4, hidden: 256, heads: 4, seq_len: 256}}
    training: {{max_steps: 100, micro_batch: 4, global_batch: 64, log_every: 5}}
  - name: beta
    model: {{layers: 2, hidden: 128, heads: 4, seq_len: 128}}
    training: {{max_steps: 50, micro_batch: 4, global_batch: 64}}
"""


class Page(HTMLParser):
    """The <img> tags and the text of a page."""

    def __init__(self, html: str):
        super().__init__()
        self.imgs: list[dict[str, str]] = []
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "img":
            self.imgs.append(dict(attrs))

    def handle_data(self, data):
        self.text.append(data)


def decode(src: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix), src[:40]
    return Image.open(io.BytesIO(base64.b64decode(src[len(prefix):])))


def assert_real_plot(img: dict[str, str]) -> None:
    image = decode(img["src"])
    assert image.format == "PNG" and image.size == (plots.WIDTH, plots.HEIGHT)
    assert (img["width"], img["height"]) == (str(plots.WIDTH), str(plots.HEIGHT))
    pixels = np.asarray(image.convert("L"), dtype=float)
    assert pixels.std() > 5, f"{img['alt']}: a blank image"


def write_project(tmp_path: Path) -> Path:
    path = tmp_path / "rep.yaml"
    path.write_text(GPU_PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), price=PRICE))
    return path


def synthesize_run(project_file: Path, model: str = "alpha", steps: int = 40, slow_rank: int = 3,
                   gpu_csv: bool = True) -> RunPaths:
    """A run of ``model`` as a 2-node x 2-rank job would leave it (4 ranks, rank 3 slow in data), 40 steps."""
    project = load_project(project_file)
    paths = RunPaths(Path(project.storage.root) / project.name / model)
    paths.root.mkdir(parents=True)
    write_record(paths.run_json, RunInfo(project=project.name, model=model, fingerprint="f" * 16, dataset="/d", created=T0))
    write_atomic(paths.config, dump_project(project))
    rows = [{"step": s, "loss": 6.0 / (1 + s / 10), "lr": 3e-4 * min(1, s / 10), "grad_norm": 2.0 / (1 + s / 20),
             "tokens_per_s": 150000.0 + 1000 * (s % 3), "step_time_s": 0.63 if s > 5 else 2.0, "mfu": 0.38,
             "tokens": s * 16384, "time": T0 + 60 + 9 * s, "mem_allocated_gib": 61.5, "slowest_rank": slow_rank}
            for s in range(5, steps + 1, 5)]
    paths.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths.timing.mkdir()
    for rank in range(4):
        node = f"node-{rank // 2 + 1}"
        with open(paths.rank_timing(rank), "w") as f:
            for r in rows:
                data = 0.41 if rank == slow_rank else 0.01
                compute = 0.2 if rank == slow_rank else 0.6
                f.write(json.dumps({"step": r["step"], "steps": 5, "rank": rank, "node": node, "data_s": data,
                                    "compute_s": compute, "comm_s": 0.004 + 0.001 * rank, "step_s": 0.63,
                                    "time": r["time"]}) + "\n")
    paths.monitor.mkdir()
    for n, node in enumerate(("node-1", "node-2")):
        with open(paths.node_samples(node), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(WITH_GPUS if gpu_csv else HOST_ONLY)
            for i in range(30):
                t = T0 + 50 + 12 * i
                host = [40 + i % 7, 9.1, 800000 + 1000 * i, 2000000, 1.0, 2.0, 3.0, 4.0]
                if not gpu_csv:
                    w.writerow([format_timestamp(t), *host])
                    continue
                for gpu in range(2):
                    w.writerow([format_timestamp(t), "NVIDIA H200", 90 + (i + gpu + n) % 9, 70000 + 100 * i, 143771,
                                60 + gpu, 600.5 + 10 * gpu, gpu, 1980, "0x0000000000000001", 0, "", 0, *host])
    append_event(paths.events, Event(time=T0 + 300, kind="straggler", step=25, rank=slow_rank, node="node-2", part="data",
                                     message=f"rank {slow_rank} on node-2 is slow in data: 0.410 s/step vs 0.010 s median",
                                     value=0.41, threshold=0.015))
    append_event(paths.node_events("node-1"), Event(time=T0 + 200, kind="gpu_temperature", node="node-1", gpu=1,
                                                    message="GPU 1 at 86 C (limit 85 C)", value=86, threshold=85))
    write_usage(paths, Usage(attempts=[Attempt(started=T0, last=T0 + 3600, ended=T0 + 3600, state=State.COMPLETED,
                                               job_id="4242", nodes=["node-1", "node-2"], gpus=16, world_size=4,
                                               step=steps, allocated=T0 - 30, first_step=T0 + 60, stall_s=90.0,
                                               saved_step=steps, saved_at=T0 + 3590)]))
    for step in (20, 40):
        ckpt = paths.checkpoints / f"step_{step:08d}"
        ckpt.mkdir(parents=True)
        (ckpt / ".metadata").write_bytes(b"x")
        (ckpt / "meta.json").write_text(json.dumps({"format": "clustertrain-checkpoint", "version": 2, "step": step,
                                                    "time": T0 + 60 + 9 * step + 2}))
    (paths.checkpoints / "latest").write_text("step_00000040")
    write_status_record(paths, RunStatus(state=State.COMPLETED, step=steps, time=T0 + 3600))
    return paths


def render(target: Path, overrides: list[str] | None = None) -> tuple[str, Page]:
    html = render_html(gather(target, overrides))
    return html, Page(html)


def section(html: str, model: str) -> str:
    start = html.index(f'data-model="{model}"')
    end = html.find("<section", start)
    return html[start:end if end > 0 else len(html)]


def test_project_report_shows_every_part_of_a_run_and_marks_the_model_that_never_started(tmp_path):
    project = write_project(tmp_path)
    synthesize_run(project)
    html, page = render(project)
    alpha = Page(section(html, "alpha"))
    keys = [attrs["data-plot"] for tag, attrs in alpha.tags if tag == "figure"]
    assert keys == ["loss_lr", "throughput", "grad_norm", "ranks", "telemetry", "progress", "goodput"]
    assert len(alpha.imgs) == len(keys)
    for img in page.imgs:
        assert_real_plot(img)
    text = " ".join(page.text)
    assert "alpha" in text and "beta" in text
    # the plan beside the measurement: step time after the first logged rows, memory, GPU-hours and cost from usage.json
    a = section(html, "alpha")
    assert "630 ms" in a and "61.50 GiB" in a
    assert "16.000" in a and f"${16 * PRICE / 8:,.2f}" in a  # 16 GPUs x 1 h x $4.325 per GPU-hour
    plan_row = a[a.index("step time</td>"):a.index("</tr>", a.index("step time</td>"))]
    assert plan_row.count(" ms</td>") == 2 and "x</td>" in plan_row  # a planned and a measured time, and their ratio
    # events of rank 0 and of the node sampler, oldest first, with where they happened
    assert a.index("gpu_temperature") < a.index("straggler")
    assert "rank 3 node-2 (data)" in a and "node-1 gpu 1" in a
    assert "step_00000020" in a and "step_00000040" in a
    assert "missing:" not in a
    # the model that never started: its state, the missing run directory, no figures, no traceback
    b = section(html, "beta")
    assert "not started" in b and "the model has not started" in b and "<img" not in b
    assert "run directory" in b


def test_summary_table_has_one_row_per_model_with_state_progress_and_cost(tmp_path):
    project = write_project(tmp_path)
    synthesize_run(project)
    html, _ = render(project)
    summary = html[html.index('class="summary"'):html.index("</table>", html.index('class="summary"'))]
    rows = summary.split("<tr>")[2:]
    assert [("alpha" in r, "beta" in r) for r in rows] == [(True, False), (False, True)]
    assert "completed" in rows[0] and "40 / 100" in rows[0] and "38.0%" in rows[0] and "$69.20" in rows[0]
    assert "2 (" not in rows[0] and ">2</td>" in rows[0]  # two events, no error
    assert "not started" in rows[1] and "- / 50" in rows[1]


def test_slowest_rank_is_the_one_rank_0_named_else_the_largest_multiple_of_the_median(tmp_path):
    paths = synthesize_run(write_project(tmp_path), slow_rank=2)
    timing = read_timing(paths)
    assert sorted(timing) == [0, 1, 2, 3]
    assert slowest_rank(timing, []) == 2  # its data time is 41x the median
    assert slowest_rank(timing, [{"slowest_rank": 1}, {"slowest_rank": 1}, {"slowest_rank": 2}]) == 1
    assert slowest_rank({0: timing[0]}, []) is None


def test_a_cpu_run_plots_host_cpu_and_memory_and_says_there_are_no_gpu_columns(tmp_path):
    paths = synthesize_run(write_project(tmp_path), gpu_csv=False)
    html, page = render(paths.root)
    assert "no GPU columns" in html and "Host CPU and memory per node" in html
    assert len(page.imgs) == 7
    for img in page.imgs:
        assert_real_plot(img)


def test_truncated_last_lines_are_skipped_and_the_report_still_renders(tmp_path):
    paths = synthesize_run(write_project(tmp_path))
    with open(paths.metrics, "a") as f:
        f.write('{"step": 45, "loss": 0.1, "lr"')  # cut by a kill
    with open(paths.node_samples("node-1"), "a") as f:
        f.write(format_timestamp(T0 + 500) + ",NVIDIA H200,97,7")
    with open(paths.rank_timing(0), "a") as f:
        f.write('{"step": 45, "rank": 0, "da')
    with open(paths.events, "a") as f:
        f.write('{"time": 1795000400.0, "kind": "loss_')
    report = gather(paths.root)
    m = report.models[0]
    assert m.metrics[-1]["step"] == 40 and m.timing[0][-1].step == 40 and len(m.events) == 2
    assert len(m.samples["node-1"]) == 60  # 30 samples x 2 GPUs, the cut row left out
    page = Page(render_html(report))
    assert len(page.imgs) == 7


def test_a_run_with_no_metrics_yet_marks_every_missing_part(tmp_path):
    project = write_project(tmp_path)
    proj = load_project(project)
    paths = RunPaths(Path(proj.storage.root) / "rep" / "alpha")
    paths.root.mkdir(parents=True)
    write_record(paths.run_json, RunInfo(project="rep", model="alpha", fingerprint="f" * 16, dataset="/d", created=T0))
    write_atomic(paths.config, dump_project(proj))
    html, page = render(paths.root)
    assert page.imgs == []
    missing = html[html.index("missing:"):html.index("</div>", html.index("missing:"))]
    for part in ("metrics.jsonl", "timing/rank&lt;R&gt;.jsonl", "usage.json", "monitor/&lt;node&gt;.csv", "checkpoints"):
        assert part in missing
    assert "no events" in html and "no complete checkpoint" in html
    assert "not started" in html and "no rank has started" in html


def test_damaged_records_are_named_and_the_rest_is_shown(tmp_path):
    paths = synthesize_run(write_project(tmp_path))
    paths.status.write_text("{not json")
    paths.config.write_text("models: [")
    (paths.checkpoints / "step_00000020" / "meta.json").write_text("[]")
    html, page = render(paths.root)
    missing = html[html.index("missing:"):html.index("</div>", html.index("missing:"))]
    assert "status.json" in missing and "config.yaml: " in missing
    assert "checkpoint step_00000020" in missing
    assert "no plan: the run&#39;s config.yaml could not be read" in html
    assert len(page.imgs) == 7  # metrics, timing, samples and events are still drawn


def test_text_from_the_run_is_escaped_and_the_page_loads_nothing(tmp_path):
    paths = synthesize_run(write_project(tmp_path))
    append_event(paths.events, Event(time=T0 + 400, kind="loss_spike", step=30,
                                     message='<script>alert("x")</script> a"=0"'))
    html, page = render(paths.root)
    assert '<script>alert("x")</script>' not in html and "&lt;script&gt;alert" in html
    scripts = [attrs for tag, attrs in page.tags if tag == "script"]
    assert scripts == [{}]  # the one inline script, no src
    assert not [a for tag, a in page.tags if tag == "link"]
    assert all(img["src"].startswith("data:image/png;base64,") for img in page.imgs)
    assert "default-src 'none'" in html


def test_neither_a_run_directory_nor_a_project_is_one_line_and_exit_2(tmp_path):
    with pytest.raises(RunDirError, match="neither a run directory \\(no run.json\\) nor a project file"):
        gather(tmp_path)
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nothing-here")])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith(f"error: {tmp_path / 'nothing-here'}: neither a run directory")
    paths = synthesize_run(write_project(tmp_path))
    with pytest.raises(ConfigError, match="--set applies to a project file"):
        gather(paths.root, ["storage.root=/x"])


def test_default_outputs_and_the_command(tmp_path):
    project = write_project(tmp_path)
    paths = synthesize_run(project)
    out, report = write_report(paths.root)
    assert out == paths.root / "report.html" and len(report.models) == 1
    res = CliRunner().invoke(app, ["report", str(project)])
    assert res.exit_code == 0, res.output
    expected = tmp_path / "fsx" / "rep" / "report.html"
    assert res.output == f"wrote {expected} (2 models: alpha completed, beta not started)\n"
    assert Page(expected.read_text()).imgs and not [p for p in expected.parent.iterdir() if p.name.startswith(".report")]
    res = CliRunner().invoke(app, ["report", str(project), "-o", str(tmp_path / "x.html"), "--set",
                                   "models.0.training.max_steps=80", "--set", "models.beta.training.max_steps=70"])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "x.html").read_text()
    assert "40 / 100" in page  # a run's max_steps is what its own config.yaml says ...
    assert "- / 70" in page    # ... a model that never ran has the project's, --set included


def test_a_run_stopped_by_a_non_finite_loss_shows_failed_its_message_and_the_error(tmp_path):
    paths = synthesize_run(write_project(tmp_path))
    with open(paths.metrics, "a") as f:
        f.write(json.dumps({"step": 45, "loss": float("nan"), "lr": 3e-4, "grad_norm": float("inf"), "time": T0 + 500}) + "\n")
    append_event(paths.events, Event(time=T0 + 500, kind="nonfinite", severity="error", step=45,
                                     message="loss is nan at step 45; last good checkpoint step_00000040"))
    write_status_record(paths, RunStatus(state=State.FAILED, step=45, time=T0 + 501,
                                         message="loss is nan at step 45; last good checkpoint step_00000040"))
    html, page = render(paths.root)
    summary = html[html.index('class="summary"'):html.index("</table>", html.index('class="summary"'))]
    assert "state-failed" in summary and "45 / 100" in summary and ">3 (1 error)</td>" in summary
    a = section(html, "alpha")
    assert a.count("loss is nan at step 45; last good checkpoint step_00000040") == 2  # the message and the event
    assert 'class="sev-error"' in a
    for img in page.imgs:
        assert_real_plot(img)


def test_a_running_run_whose_rank_0_is_gone_is_shown_failed(tmp_path):
    """The state comes from clustertrain.monitor.status.model_status: RUNNING with rank 0's pid gone on this host."""
    import socket
    import subprocess
    import sys

    paths = synthesize_run(write_project(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    write_status_record(paths, RunStatus(state=State.RUNNING, step=0, pid=pid, time=T0))
    write_usage(paths, Usage(attempts=[Attempt(started=T0, last=T0 + 3600, state=State.RUNNING, job_id=f"local-{pid}",
                                               nodes=[socket.gethostname()], gpus=16, world_size=4, pid=pid,
                                               host=socket.gethostname())]))
    html, _ = render(paths.root)
    assert "state-failed" in html and f"rank 0 (pid {pid}) is gone without a final state" in html


def table(html: str, cls: str) -> list[str]:
    """The rows (after the header) of the first ``<table class=cls>`` in ``html``."""
    start = html.index(f'class="{cls}"')
    return html[start:html.index("</table>", start)].split("<tr>")[2:]


def test_goodput_per_attempt_its_plot_and_the_projects_total(tmp_path):
    project = write_project(tmp_path)
    paths = synthesize_run(project)
    nodes = dict(job_id="4242", nodes=["node-1", "node-2"], gpus=16, world_size=4)
    write_usage(paths, Usage(attempts=[
        Attempt(started=T0, last=T0 + 1800, ended=T0 + 1800, state=State.FAILED, step=25, allocated=T0 - 60,
                first_step=T0 + 60, saved_step=20, saved_at=T0 + 1200, **nodes),
        Attempt(started=T0 + 2000, last=T0 + 3600, ended=T0 + 3600, state=State.COMPLETED, step_start=20, step=40,
                allocated=T0 + 1990, first_step=T0 + 2100, stall_s=100, saved_step=40, saved_at=T0 + 3600, **nodes)]))
    paths.jobs.write_text(json.dumps({"version": 1, "job_id": "4242", "model": "alpha", "job_name": "rep-alpha",
                                      "script": "s", "output": "o", "submitted": T0 - 660, "restarts": 1}) + "\n")
    html, page = render(project)
    a = section(html, "alpha")
    first, second, total = table(a, "goodput")
    # failed after its step-20 checkpoint: 2 min start-up, the 10 min after the checkpoint (5 steps) lost
    assert all(x in first for x in ("failed", "31m 00s", "2m 00s", "19m 00s", "10m 00s", ">5</td>"))
    assert first.count("10m 00s") == 2  # lost work, and the queue wait since the submission
    # requeued and completed: 1m 50s start-up, 1m 40s checkpoint stalls, nothing lost; 3m 10s in the queue again
    assert all(x in second for x in ("completed", "1m 50s", "1m 40s", "23m 20s", ">0</td>", "3m 10s"))
    assert "1.928" in total and "0.333" in total  # node-hours: 2 nodes x 3,470 s allocated, 2 x 600 s lost
    assert "73.2% of 1.928 allocated node-hours was productive over\n2 attempts (1 restart); queue wait 13m 10s" in a
    summary = table(html, "summary")[0]
    assert "73.2%" in summary and ">1</td>" in summary
    assert "goodput over every attempt of every model:\n<b>73.2%</b>" in html
    plot = next(img for img in Page(a).imgs if "Goodput" in img["alt"])
    assert_real_plot(plot)
    # beta never ran: no attempt, no goodput, no plot of it
    assert "no attempt recorded (usage.json): no goodput" in section(html, "beta")


def test_incidents_and_the_projects_suspect_nodes(tmp_path):
    from clustertrain.core.storage_layout import storage_layout
    from clustertrain.monitor.suspects import add_suspect

    project = write_project(tmp_path)
    paths = synthesize_run(project)
    html, _ = render(project)
    assert "none: no node of the project is excluded" in html and "no incident (hang or lost rank)" in html
    where = paths.incidents / "20261123-101112"
    where.mkdir(parents=True)
    (where / "incident.json").write_text(json.dumps({
        "version": 1, "id": "20261123-101112", "time": T0 + 900, "kind": "hang", "job": "4242",
        "message": "<b>rank 1</b> on node-2 is stuck in collective of step 7 for 41 s", "step": 7,
        "phase": "collective", "ranks": [1], "nodes": ["node-2"], "waited_s": 41.2, "bound_s": 30.0,
        "stacks": ["stacks/rank0.txt", "stacks/rank2.txt"], "missing_stacks": [1], "flight": []}))
    (paths.incidents / "20261123-000000").mkdir()
    (paths.incidents / "20261123-000000" / "incident.json").write_text("[]")  # not an incident: skipped
    add_suspect(storage_layout(load_project(project)).suspects_file(), "node-2", source="hang",
                reason="rank 1 <stuck>", ttl_h=24, job="4242", model="alpha")
    for target in (project, paths.root):  # a project, and a run directory (its config.yaml names the project)
        html, _ = render(target)
        (incident,) = table(section(html, "alpha"), "incidents")
        assert all(x in incident for x in ("hang", "4242", ">7</td>", "collective", "node-2", str(where),
                                           "2 stacks; none from rank 1", "&lt;b&gt;rank 1&lt;/b&gt; on node-2"))
        (suspect,) = table(html, "suspects")
        assert "node-2" in suspect and "rank 1 &lt;stuck&gt;" in suspect and "job 4242 (alpha)" in suspect
