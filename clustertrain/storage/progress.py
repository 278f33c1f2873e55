"""Rich progress bars for hashing and transfers, drawn on stderr and only on a terminal."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


def make_progress(enabled: bool) -> Progress:
    """A byte-counting progress bar; a no-op when ``enabled`` is false or stderr is not a terminal."""
    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not (enabled and console.is_terminal),
    )
