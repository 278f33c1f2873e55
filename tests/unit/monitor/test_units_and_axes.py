"""Status that tells the truth (issue 36 item 6): a project without GPUs (``cluster.gpus_per_node: 0``) is shown in
CPU-hours and memory per rank by ``status`` and the report, GPU projects keep their words; the report's utilisation
axes run 0-100 % whatever the values; event labels on one step never overprint; ``status --watch`` says when it
last refreshed."""

from __future__ import annotations

import csv
import json
import re
import time
from datetime import datetime
from itertools import combinations
from pathlib import Path

import pytest
from rich.console import Console

from clustertrain.core.run_events import Attempt, Event, Usage, append_event, write_usage
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import RunInfo, write_record
from clustertrain.monitor import plots, status_view as view
from clustertrain.monitor.report import ModelData, gather, render_html
from clustertrain.monitor.samples import HOST_ONLY, WITH_GPUS, format_timestamp, read_samples
from clustertrain.monitor.status import model_status
from clustertrain.project import dump_project
from clustertrain.resolve import load_project

T0 = 1795000000.0
CPU_PROJECT = """name: cpu
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 2}}
storage: {{root: {root}}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 2, seq_len: 64}}
    training: {{max_steps: 40, micro_batch: 2, global_batch: 4, log_every: 5}}
"""
GPU_PROJECT = """name: gpu
cluster: {{backend: slurm, nodes: 1, gpus_per_node: 8, instance_type: p5e.48xlarge, partition: gpu}}
storage: {{root: {root}, region: ap-southeast-3}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 2, seq_len: 64}}
    training: {{max_steps: 40, micro_batch: 2, global_batch: 16, log_every: 5}}
"""


@pytest.fixture
def figures(monkeypatch) -> list:
    """Every matplotlib figure the plots module saves, kept to look at its axes."""
    seen = []
    real = plots._png

    def keep(fig):
        seen.append(fig)
        return real(fig)

    monkeypatch.setattr(plots, "_png", keep)
    return seen


def write_run(tmp_path: Path, template: str, gpu_csv: bool) -> tuple[Path, RunPaths]:
    """A run of model ``tiny`` of the project: 40 steps on 1 node, two ranks, 30 sampler rows, events on one step."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    project_file = tmp_path / "p.yaml"
    project_file.write_text(template.format(root=json.dumps(str(tmp_path / "fsx"))))
    project = load_project(project_file)
    paths = RunPaths(Path(project.storage.root) / project.name / "tiny")
    paths.root.mkdir(parents=True)
    write_record(paths.run_json, RunInfo(project=project.name, model="tiny", fingerprint="f" * 16, dataset="/d",
                                         created=T0))
    write_atomic(paths.config, dump_project(project))
    rows = [{"step": s, "loss": 6.0 / (1 + s / 10), "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 900.0 + s,
             "step_time_s": 0.5, "mfu": 0.41 + 0.001 * (s % 2), "time": T0 + 60 + 9 * s, "mem_allocated_gib": 0.25}
            for s in range(5, 41, 5)]
    paths.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths.monitor.mkdir()
    with open(paths.node_samples("node-1"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(WITH_GPUS if gpu_csv else HOST_ONLY)
        for i in range(30):
            t = T0 + 50 + 12 * i
            host = [99.7 + 0.3 * (i % 2), 2.0, 3000 + i, 16000, 0.0, 0.0, 0.0, 0.0]  # a CPU run: the cores pinned
            if gpu_csv:
                w.writerow([format_timestamp(t), "NVIDIA H200", 99 + i % 2, 70000 + 10 * i, 143771, 60, 600.5, 0,
                            1980, "0x0", 0, "", 0, *host])
            else:
                w.writerow([format_timestamp(t), *host])
    for kind in ("loss_spike", "straggler", "straggler", "throughput_drop"):  # four events at step 25, one at 40
        append_event(paths.events, Event(time=T0 + 285, kind=kind, step=25, message=kind))
    append_event(paths.events, Event(time=T0 + 420, kind="nonfinite", step=40, severity="error", message="nan"))
    write_usage(paths, Usage(attempts=[Attempt(started=T0, last=T0 + 3600, ended=T0 + 3600, state="COMPLETED",
                                               gpus=2, nodes=["node-1"], job_id="local-1", step=40)]))
    return project_file, paths


# -- the report's axes and labels ---------------------------------------------------------------------------------


def test_host_cpu_pinned_at_100_is_drawn_on_a_0_to_100_axis_and_memory_up_to_the_total(tmp_path, figures):
    _, paths = write_run(tmp_path, CPU_PROJECT, gpu_csv=False)
    samples = {"node-1": read_samples(paths.node_samples("node-1"))}
    plot = plots.telemetry_figure(samples, [], plots.Clock.spanning(T0, T0 + 400, "t0"))
    assert plot is not None and plot.key == "telemetry"
    cpu, memory = figures[-1].axes
    assert cpu.get_ylabel() == "host CPU %" and cpu.get_ylim() == (0.0, 100.0)  # not 99.7-100 autoscaled
    assert memory.get_ylim() == (0.0, pytest.approx(16000 / 1024))


def test_gpu_utilisation_and_memory_axes_are_fixed_too(tmp_path, figures):
    _, paths = write_run(tmp_path, GPU_PROJECT, gpu_csv=True)
    samples = {"node-1": read_samples(paths.node_samples("node-1"))}
    plots.telemetry_figure(samples, [], plots.Clock.spanning(T0, T0 + 400, "t0"))
    util, memory, power = figures[-1].axes
    assert util.get_ylabel() == "GPU utilisation %" and util.get_ylim() == (0.0, 100.0)
    assert memory.get_ylim() == (0.0, pytest.approx(143771 / 1024))
    assert power.get_ylim()[1] < 1000  # power is not a share: it keeps its own scale


def test_the_mfu_panel_runs_from_0_to_100(tmp_path, figures):
    rows = [{"step": s, "tokens_per_s": 1000.0, "mfu": 0.41 + 0.001 * (s % 2)} for s in range(1, 20)]
    plots.step_figure("throughput", "t", rows, [plots.Panel("tokens_per_s", "tokens/s"),
                                                plots.Panel("mfu", "MFU %", 100.0, limits=plots.PERCENT)])
    assert figures[-1].axes[1].get_ylim() == (0.0, 100.0)
    assert figures[-1].axes[0].get_ylim() != (0.0, 100.0)  # other panels still scale to their values


def test_events_on_one_step_share_one_label_named_once_with_their_counts():
    marks = [plots.Marker(25, "loss_spike", "warning"), plots.Marker(25, "straggler", "warning"),
             plots.Marker(25.1, "straggler", "warning"), plots.Marker(25, "nonfinite", "error"),
             plots.Marker(40, "throughput_drop", "warning")]
    groups = plots.label_groups(marks, gap=0.5)
    assert [(g.x, g.label, g.kind) for g in groups] == [
        (25, "loss_spike, straggler x2, nonfinite", "error"), (40, "throughput_drop", "warning")]
    many = [plots.Marker(7, f"kind_number_{i}", "warning") for i in range(6)]
    (one,) = plots.label_groups(many, gap=0.5)
    assert one.label.endswith(" more") and len(one.label) <= plots.LABEL_CHARS + 8
    assert one.label.startswith("kind_number_0, kind_number_1")


def test_no_two_drawn_event_labels_overlap(tmp_path, figures):
    """The report's figures of a run with four events on step 25 (and events a step apart): every label's box,
    as Agg draws it, is clear of every other label's."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    marks = [plots.Marker(s, k, "warning") for s, k in ((25, "loss_spike"), (25, "straggler"), (25, "straggler"),
                                                          (26, "throughput_drop"), (27, "loss_spike"), (70, "straggler"))]
    rows = [{"step": s, "loss": 3.0 - s / 100} for s in range(1, 101)]
    plots.step_figure("loss", "Loss", rows, [plots.Panel("loss", "loss")], marks)
    fig = figures[-1]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert len(boxes) == 2  # steps 25, 26 and 27 are within a label's width at this scale: one label; 70 its own
    assert all(not a.overlaps(b) for a, b in combinations(boxes, 2))
    assert "straggler x2" in fig.axes[0].texts[0].get_text()


# -- the units of a project without GPUs ---------------------------------------------------------------------------


def test_a_cpu_projects_report_is_in_cpu_hours_and_memory_per_rank(tmp_path):
    project_file, _ = write_run(tmp_path, CPU_PROJECT, gpu_csv=False)
    report = gather(project_file)
    (m,) = report.models
    assert m.cpu and report.hours_unit == "CPU-hours"
    quantities = [q for q, *_ in m.comparison()]
    assert "memory per rank" in quantities and "CPU-hours (planned: whole run; measured: so far)" in quantities
    assert m.gpu_hours == pytest.approx(2.0)  # 2 ranks x 1 h of wall clock
    html = render_html(report)
    assert "<th>CPU-hours</th>" in html and "memory per rank" in html
    assert "GPU-hours" not in html and "memory per GPU" not in html


def test_a_gpu_projects_report_keeps_its_gpu_words(tmp_path):
    project_file, _ = write_run(tmp_path, GPU_PROJECT, gpu_csv=True)
    report = gather(project_file)
    (m,) = report.models
    assert not m.cpu and report.hours_unit == "GPU-hours"
    html = render_html(report)
    assert "<th>GPU-hours</th>" in html and "memory per GPU" in html and "CPU-hours" not in html
    assert ModelData("x", tmp_path).hours_unit == "GPU-hours"  # a project that could not be read: as before


def test_status_shows_cpu_hours_for_a_project_without_gpus_and_gpu_hours_otherwise(tmp_path):
    for template, header, other in ((CPU_PROJECT, "CPU-h", "GPU-h"), (GPU_PROJECT, "GPU-h", "CPU-h")):
        _, paths = write_run(tmp_path / header, template, gpu_csv=False)
        row = model_status("tiny", paths.root, now=T0 + 7200)
        console = Console(record=True, width=240)
        console.print(view.status_view([row], now=T0 + 7200))
        text = console.export_text()
        assert header in text and other not in text and "2.00" in text  # 2 ranks/GPUs x 1 h either way
        assert view.trains_on_cpus([row]) is (header == "CPU-h")
    narrow = Console(record=True, width=60)  # a left-out hours column is named in the project's words
    narrow.print(view.status_table([row], 60, cpu=True))
    caption = narrow.export_text()
    assert "not shown at this width" in caption and "CPU-h" in caption and "GPU-h" not in caption


def test_a_run_directory_without_a_readable_config_keeps_the_gpu_words(tmp_path):
    row = model_status("tiny", tmp_path / "nowhere")
    assert view.trains_on_cpus([row]) is False
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.yaml").write_text("cluster: [unclosed")
    assert view.trains_on_cpus([model_status("tiny", tmp_path / "bad")]) is False


# -- status --watch ------------------------------------------------------------------------------------------------


def test_watch_says_the_local_time_of_each_refresh(tmp_path, monkeypatch):
    _, paths = write_run(tmp_path, CPU_PROJECT, gpu_csv=False)
    calls = []
    seen = []

    def clock() -> float:  # 100 s, 105 s, ... after T0, one tick per call
        calls.append(None)
        return T0 + 95.0 + 5 * len(calls)

    def collect():
        if len(seen) == 2:
            raise KeyboardInterrupt
        seen.append(model_status("tiny", paths.root, now=T0 + 100))
        return [seen[-1]]

    monkeypatch.setattr(view.time, "sleep", lambda s: None)
    monkeypatch.setattr(view.time, "time", clock)
    console = Console(record=True, width=240, force_terminal=True)
    rows = view.watch(collect, 5.0, console)
    assert rows == seen[-1:]
    text = console.export_text()
    stamps = re.findall(r"refreshed (\d\d:\d\d:\d\d)", text)
    assert stamps[0] == datetime.fromtimestamp(T0 + 100).strftime("%H:%M:%S")  # the first refresh's local time
    assert len(stamps) >= 2 and stamps[-1] > stamps[0]  # and each refresh its own, later
    assert view.refreshed_line(T0) == f"refreshed {time.strftime('%H:%M:%S', time.localtime(T0))} (Ctrl-C to stop)"
    plain = Console(record=True, width=240)
    plain.print(view.status_view(seen, now=T0))
    assert "refreshed" not in plain.export_text()  # a single `status` has no refresh line
