"""The one way clustertrain runs a Slurm client command (sbatch, squeue, scontrol, sacct, scancel, sinfo).

Every call gets ``SLURM_TIME_FORMAT=standard`` (times parse as ISO-8601 whatever the user's own
setting), a timeout, and one-line errors: a missing client names the package to install, a failing
command its last line of stderr. :func:`require_slurm` (``scontrol ping``) is what a command that talks
to Slurm runs first, before it writes anything: no controller is one line naming SLURM_CONF and the fix.
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


#: The fix every "Slurm not reachable" line names: the local cluster's client variables.
LOCAL_ENV_FIX = 'eval "$(clustertrain local-slurm env)"'
_DEFAULT_CONF = "/etc/slurm/slurm.conf"


class SlurmUnreachable(LaunchError):
    """No Slurm controller answered ``scontrol ping`` (one line: what was tried, and the fix)."""


def slurm_unreachable(env: Mapping[str, str] | None = None, timeout: float = 10.0) -> str | None:
    """None when a controller answers ``scontrol ping`` (``SLURM_CONF`` from ``env`` over this process's
    environment); else one line naming SLURM_CONF's value (or its absence), the controller it names, what
    ``scontrol`` said, and the fix. A SLURM_CONF naming no file is answered without running scontrol, which
    would retry for a minute."""
    merged = {**os.environ, **(env or {})}
    conf = merged.get("SLURM_CONF")
    if conf is not None:
        where = f"SLURM_CONF={conf}"
        if not os.path.isfile(conf):
            return (f"Slurm not reachable: {where or 'SLURM_CONF='} is not a file; point SLURM_CONF at a running "
                    f"cluster's slurm.conf, for the local cluster: {LOCAL_ENV_FIX}")
        where += _controller_of(conf)
    elif os.path.isfile(_DEFAULT_CONF):
        where = f"SLURM_CONF unset, so {_DEFAULT_CONF}{_controller_of(_DEFAULT_CONF)}"
    else:
        where = f"SLURM_CONF unset and no {_DEFAULT_CONF}"
    fix = f"start the cluster or point SLURM_CONF at a running one's slurm.conf, for the local cluster: {LOCAL_ENV_FIX}"
    try:
        proc = run_slurm(["scontrol", "ping"], env=env, check=False, timeout=timeout)
    except LaunchError as e:
        return f"Slurm not reachable: `scontrol ping` with {where}: {e}; {fix}"
    if proc.returncode == 0 and " is UP" in proc.stdout:
        return None
    said = next((ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines()
                 if "is DOWN" in ln or "fatal" in ln), last_line(proc.stderr or proc.stdout))
    return f"Slurm not reachable: `scontrol ping` with {where} answered {said!r}; {fix}"


def require_slurm(env: Mapping[str, str] | None = None, timeout: float = 10.0) -> None:
    """Raise :class:`SlurmUnreachable` (one line, see :func:`slurm_unreachable`) unless a controller answers."""
    problem = slurm_unreachable(env, timeout)
    if problem:
        raise SlurmUnreachable(problem)


def _controller_of(conf: str) -> str:
    """`` (controller HOST:PORT)`` as ``conf`` names it, or "" when it cannot be read."""
    host, port = None, "6817"
    try:
        with open(conf, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.split("#", 1)[0].strip().partition("=")
                if key.lower() in ("slurmctldhost", "controlmachine") and host is None and value:
                    host = value.split("(", 1)[-1].rstrip(")") if "(" in value else value
                elif key.lower() == "slurmctldport" and value:
                    port = value.strip()
    except OSError:
        return ""
    return f" (controller {host}:{port})" if host else ""
