"""The one way clustertrain runs a Slurm client command (sbatch, squeue, scontrol, sacct, scancel, sinfo).

Every call gets ``SLURM_TIME_FORMAT=standard`` (times parse as ISO-8601 whatever the user's own
setting), a timeout, and one-line errors: a missing client names the package to install, a failing
command its last line of stderr.
"""

from __future__ import annotations

import os
import subprocess
from typing import Mapping

from clustertrain.core.errors import LaunchError


def run_slurm(argv: list[str], env: Mapping[str, str] | None = None, check: bool = True,
              timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``argv`` with ``env`` added to this process's environment; raise :class:`LaunchError` on a
    missing client, a timeout, or (with ``check``) a non-zero exit."""
    full_env = {**os.environ, **(env or {}), "SLURM_TIME_FORMAT": "standard"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=timeout)
    except FileNotFoundError:
        raise LaunchError(f"`{argv[0]}` not found: install the Slurm client (slurm-client) or fix PATH") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"`{' '.join(argv)}` did not answer in {timeout:.0f} s: is slurmctld up? (scontrol ping)") from None
    if check and proc.returncode != 0:
        raise LaunchError(f"`{' '.join(argv)}` failed: {last_line(proc.stderr or proc.stdout)}")
    return proc


def last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no error output"
