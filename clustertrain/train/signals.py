"""Graceful stop: SIGTERM, SIGINT and SIGUSR2 ask the trainer to finish the current step, save and exit 0.

USR2, not USR1, is the preemption signal (NCCL may use USR1; submitit avoids it too).
A second SIGINT interrupts at once.
"""

from __future__ import annotations

import signal
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.received: float | None = None  # when the first stop signal came (Unix seconds)

    def install(self) -> "StopRequest":
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        if self.received is None:
            self.received = time.time()

    @property
    def requested(self) -> bool:
        return self.signal_name is not None
