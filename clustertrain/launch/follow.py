"""Show a local run as it goes: rank 0's output line by line, and a progress bar
(step, loss, tokens/s, ETA) fed from ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from clustertrain.launch.local import LocalLauncher, WaitResult
from clustertrain.launch.prepare import RunSpec


class _Tail:
    """Read the lines appended to a file since the last call (the file may not exist yet)."""

    def __init__(self, path: Path, from_end: bool = False):
        self.path = path
        self.offset = path.stat().st_size if from_end and path.exists() else 0
        self.partial = ""

    def read(self) -> list[str]:
        try:
            with open(self.path, "r", encoding="utf-8", errors="replace") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        data = self.partial + data
        lines = data.split("\n")
        self.partial = lines.pop()
        return lines


def follow_local(launcher: LocalLauncher, job_id: str, spec: RunSpec, console: Console) -> WaitResult:
    cfg = spec.entry.training
    log_tail = _Tail(spec.paths.rank_log(0), from_end=False)
    log_tail.offset = _last_header_offset(spec.paths.rank_log(0))
    metrics_tail = _Tail(spec.paths.metrics, from_end=True)
    progress = Progress(
        TextColumn("[bold]{task.fields[model]}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
        refresh_per_second=2,  # the launcher shares the cores with the ranks: redraw rarely
    )
    task = progress.add_task("train", total=cfg.max_steps, model=spec.entry.name, loss="-", tps="-")

    def tick() -> None:
        for line in log_tail.read():
            if line.startswith("error: "):  # a rank's one-line failure: the launcher reports it as the run's, once
                continue
            progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        for line in metrics_tail.read():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            progress.update(task, completed=row["step"], loss=f"{row['loss']:.4f}", tps=f"{row['tokens_per_s']:,.0f}")

    with progress:
        result = launcher.wait(job_id, on_tick=tick)
        tick()
    return result


def _last_header_offset(path: Path) -> int:
    """Start showing rank 0's log at this run's header (the log is appended across runs)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    return max(0, data.rfind(b"=== clustertrain rank 0/"))
