"""The report of a real run opens in a real browser: a tiny quickstart-like project trained for 30 steps by 2 gloo
workers (sampler, per-rank timing, checkpoints), `clustertrain report` on it, then headless Chromium (the Debian package
`chromium`, installed by scripts/test.sh) dumps the DOM after the page's load script ran and takes a screenshot."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clustertrain.monitor import plots

from tests.support.training import run_cli

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium")
WINDOW = (1280, 2400)
PROJECT = """name: report-it
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 2, threads_per_worker: 1}}
storage: {{root: {root}}}
monitor: {{interval_s: 0.5}}
models:
  - name: tiny-gpt
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    data: {{source: "builtin:shakespeare", tokenizer: byte}}
    training: {{max_steps: 30, micro_batch: 4, global_batch: 16, lr: 3.0e-3, warmup_steps: 4, checkpoint_every: 10,
               log_every: 2, seed: 7}}
  - name: never-run
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 10, micro_batch: 4, global_batch: 16}}
"""


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/test.sh installs the Debian package "
                                              "`chromium`; apt-get install chromium)")
def test_the_report_of_a_real_run_renders_its_plots_in_chromium(tmp_path):
    project = tmp_path / "p.yaml"
    project.write_text(PROJECT.format(root=json.dumps(str(tmp_path / "fsx"))))
    res = run_cli("run", str(project), "--model", "tiny-gpt")
    assert res.returncode == 0, res.stdout
    res = run_cli("report", str(project))
    report = tmp_path / "fsx" / "report-it" / "report.html"
    assert res.returncode == 0 and res.stdout.strip().endswith(
        f"wrote {report} (2 models: tiny-gpt completed, never-run not started)"), res.stdout
    html = report.read_text()
    assert "http://" not in html and "https://" not in html  # nothing to fetch: it opens offline

    dom = chromium(tmp_path, "--virtual-time-budget=3000", "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-loaded="1"' in dom.stdout  # the page's load handler ran
    rendered = re.findall(r'<img [^>]*data-rendered="(\d+)x(\d+)"', dom.stdout)
    imgs = re.findall(r"<img ", dom.stdout)
    # every plot of the trained model was decoded by the browser at its full size
    assert len(rendered) == len(imgs) >= 6
    assert set(rendered) == {(str(plots.WIDTH), str(plots.HEIGHT))}
    for key in ("loss_lr", "throughput", "grad_norm", "ranks", "telemetry", "progress"):
        assert f'data-plot="{key}"' in dom.stdout
    assert 'data-model="tiny-gpt"' in dom.stdout and 'data-model="never-run"' in dom.stdout
    assert "no GPU columns" in dom.stdout  # a CPU run: host telemetry instead

    shot = tmp_path / "report.png"
    res = chromium(tmp_path, f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", report.as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    image = Image.open(io.BytesIO(shot.read_bytes()))
    assert image.size == WINDOW
    pixels = np.asarray(image.convert("L"), dtype=float)
    assert pixels.std() > 20, "the screenshot is blank"
    # the plots are in it: rows of the upper page carry the plot lines' colour (matplotlib's first colour, C0)
    rgb = np.asarray(image.convert("RGB"), dtype=int)
    blue = (abs(rgb[..., 0] - 0x1f) < 40) & (abs(rgb[..., 1] - 0x77) < 40) & (abs(rgb[..., 2] - 0xb4) < 40)
    assert blue.sum() > 2000, f"only {blue.sum()} plot-coloured pixels in the screenshot"
