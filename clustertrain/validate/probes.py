"""Probes: read one real source each (a command, a file in /sys or /opt, a Python module) and say
what is there. Pure parsers for the text formats come first so they can be tested on captured text.

A probe returns a :class:`Finding`: ``found`` is None when the tool/library is absent ("not
found"), otherwise a short human string; ``version`` is the comparable version string when there
is one. Probes never raise for a missing tool.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

import psutil

# --------------------------------------------------------------------------- pure parsers


def parse_nvidia_smi_csv(text: str) -> list[dict[str, str | None]]:
    """Parse ``nvidia-smi --query-gpu=a,b,c --format=csv`` (with header; ``noheader`` also accepted
    when the caller passes the header line itself). Keys are the query names without the unit
    suffix (``memory.total [MiB]`` -> ``memory.total``); ``[N/A]``/``[Not Supported]`` -> None;
    values keep their units (``81559 MiB``)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return []
    header = [re.sub(r"\s*\[.*?\]\s*$", "", h.strip()) for h in lines[0].split(",")]
    rows = []
    for ln in lines[1:]:
        vals = [v.strip() for v in ln.split(",")]
        if len(vals) != len(header):
            continue  # a warning or error line, not a GPU row
        rows.append({h: (None if re.fullmatch(r"\[(N/A|Not Supported|Unknown Error)\]|N/A", v) else v)
                     for h, v in zip(header, vals)})
    return rows


def parse_fi_info(text: str) -> list[dict[str, str]]:
    """Parse ``fi_info [-p efa] [-t FI_EP_RDM]`` output into one dict per provider block
    (``provider``, ``fabric``, ``domain``, ``version``, ``type``, ``protocol``). Launcher prefixes
    (``[1,0]<stdout>:``, ``0: ``), indentation and ``...`` elisions are ignored."""
    blocks: list[dict[str, str]] = []
    for raw in text.splitlines():
        line = re.sub(r"^\s*(\[\d+,\d+\]<std(out|err)>:|\d+:\s)", "", raw).strip()
        m = re.match(r"^(provider|fabric|domain|version|type|protocol):\s*(.*)$", line)
        if not m:
            continue
        if m.group(1) == "provider":
            blocks.append({})
        elif not blocks:
            continue
        blocks[-1][m.group(1)] = m.group(2).strip()
    return blocks


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """First dotted number in ``text``: ``v1.8.1-aws`` -> (1, 8, 1), ``2.18.5-1+cuda12.2`` -> (2, 18, 5)."""
    if not text:
        return None
    m = re.search(r"(\d+(?:\.\d+)+|\d+)", text)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def version_at_least(found: str | None, required: str) -> bool | None:
    """True/False, or None when ``found`` holds no version."""
    f, r = parse_version(found), parse_version(required)
    if f is None or r is None:
        return None
    n = max(len(f), len(r))
    return f + (0,) * (n - len(f)) >= r + (0,) * (n - len(r))


# --------------------------------------------------------------------------- probes


@dataclass
class Finding:
    found: str | None  # None = not found
    version: str | None = None
    count: int | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)


def run_tool(cmd: list[str], timeout: float = 15.0) -> tuple[int, str] | None:
    """Run a command; None when the program is not installed. Output is stdout+stderr."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"{cmd[0]} timed out after {timeout:g}s"
    except OSError as e:
        return 126, f"{cmd[0]}: {e.strerror}"
    return p.returncode, (p.stdout + p.stderr).strip()


def probe_gpus() -> Finding:
    """GPUs via NVML (nvidia-ml-py), else ``nvidia-smi --query-gpu``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]
            names = [x.decode() if isinstance(x, bytes) else x for x in names]
            drv = pynvml.nvmlSystemGetDriverVersion()
            drv = drv.decode() if isinstance(drv, bytes) else drv
        finally:
            pynvml.nvmlShutdown()
        return Finding(found=f"{n} x {names[0] if names else '?'} (NVML)", version=drv, count=n, extra={"names": names})
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded...: fall through to nvidia-smi
        nvml_err = f"NVML: {e}"
    r = run_tool(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,pci.bus_id", "--format=csv"])
    if r is None:
        return Finding(found=None, detail=f"{nvml_err}; nvidia-smi not installed")
    rc, out = r
    rows = parse_nvidia_smi_csv(out) if rc == 0 else []
    if not rows:
        return Finding(found=None, detail=f"{nvml_err}; nvidia-smi exit {rc}: {out.splitlines()[0] if out else ''}")
    return Finding(found=f"{len(rows)} x {rows[0].get('name')} (nvidia-smi)", version=rows[0].get("driver_version"),
                   count=len(rows), extra={"names": [r.get("name") for r in rows]})


def probe_efa() -> Finding:
    """EFA devices: ``fi_info -p efa -t FI_EP_RDM`` and ``/sys/class/infiniband``."""
    ib = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    r = run_tool(["fi_info", "-p", "efa", "-t", "FI_EP_RDM"])
    blocks = parse_fi_info(r[1]) if r and r[0] == 0 else []
    efa = [b for b in blocks if b.get("provider") == "efa"]
    parts = []
    if r is None:
        parts.append("fi_info not installed")
    elif not efa:
        parts.append(f"fi_info -p efa: no EFA provider ({r[1].splitlines()[0][:80] if r[1] else 'exit ' + str(r[0])})")
    parts.append(f"/sys/class/infiniband: {', '.join(ib) if ib else 'absent'}")
    count = len(efa) or len([d for d in ib if d.startswith(("efa", "rdmap"))])
    if not count:
        return Finding(found=None, detail="; ".join(parts))
    return Finding(found=f"{count} EFA device(s)", count=count, detail="; ".join(parts),
                   extra={"domains": [b.get("domain") for b in efa]})


def probe_efa_installer() -> Finding:
    path = "/opt/amazon/efa_installed_packages"
    try:
        text = open(path).read()
    except OSError:
        return Finding(found=None, detail=f"{path} absent (EFA installer not run)")
    m = re.search(r"EFA installer version:\s*(\S+)", text)
    return Finding(found=m.group(1) if m else "installed (version not in file)", version=m.group(1) if m else None,
                   detail=path)


def probe_libfabric() -> Finding:
    r = run_tool(["fi_info", "--version"])
    if r is None:
        for lib in ("/opt/amazon/efa/lib/libfabric.so", "/opt/amazon/efa/lib64/libfabric.so"):
            if os.path.exists(lib):
                return Finding(found=lib, detail="fi_info not on PATH; library present")
        return Finding(found=None, detail="fi_info not installed, no /opt/amazon/efa/lib*/libfabric.so")
    m = re.search(r"libfabric:\s*(\S+)", r[1])
    return Finding(found=m.group(1) if m else r[1][:60], version=m.group(1) if m else None)


def probe_command_version(cmds: list[list[str]]) -> Finding:
    """First of ``cmds`` that runs and prints a version (``enroot version``, ``docker --version``...)."""
    notes = []
    for cmd in cmds:
        r = run_tool(cmd)
        if r is None:
            notes.append(f"{cmd[0]} not installed")
            continue
        rc, out = r
        v = parse_version(out) if rc == 0 else None
        if v:
            line = out.splitlines()[0].strip()
            return Finding(found=line[:80], version=".".join(map(str, v)), detail=" ".join(cmd))
        notes.append(f"`{' '.join(cmd)}` exit {rc}: {(out.splitlines() or [''])[-1][:100]}")
    installed = any("not installed" not in n for n in notes)
    return Finding(found="installed, version unreadable" if installed else None, detail="; ".join(notes))


def probe_mounts(candidates: list[str]) -> Finding:
    """Which candidate paths are mounted (the mount table, through psutil) and their size/free space."""
    try:
        mounts = {p.mountpoint: p.fstype for p in psutil.disk_partitions(all=True)}
    except OSError:
        mounts = {}
    seen = []
    for pat in candidates:
        for path in sorted(glob.glob(pat)) or []:
            if not os.path.isdir(path):
                continue
            usage = shutil.disk_usage(path)
            fstype = mounts.get(path, "not a mount point")
            seen.append(f"{path} ({fstype}, {usage.total / 1e12:.2f} TB, {usage.free / 1e12:.2f} TB free)")
    if not seen:
        return Finding(found=None, detail=f"none of {', '.join(candidates)} exists")
    return Finding(found="; ".join(seen), count=len(seen))


def probe_cuda_toolkit() -> Finding:
    import json

    try:
        import torch

        if torch.version.cuda:
            return Finding(found=f"{torch.version.cuda} (torch build)", version=torch.version.cuda)
        torch_note = f"torch {torch.__version__} is a CPU build"
    except ImportError:
        torch_note = "torch not installed"
    try:
        v = json.load(open("/usr/local/cuda/version.json"))["cuda"]["version"]
        return Finding(found=f"{v} (/usr/local/cuda)", version=v, detail=torch_note)
    except (OSError, KeyError, ValueError):
        pass
    r = run_tool(["nvcc", "--version"])
    if r and r[0] == 0 and (m := re.search(r"release (\d+\.\d+)", r[1])):
        return Finding(found=f"{m.group(1)} (nvcc)", version=m.group(1), detail=torch_note)
    return Finding(found=None, detail=f"{torch_note}; no /usr/local/cuda/version.json; nvcc not found")


def probe_nccl() -> Finding:
    try:
        import torch
    except ImportError:
        return Finding(found=None, detail="torch not installed")
    if not torch.cuda.is_available():
        return Finding(found=None, detail=f"CUDA not available (torch {torch.__version__}); NCCL version unreadable")
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError) as e:
        return Finding(found=None, detail=f"torch.cuda.nccl.version(): {e}")
    vs = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return Finding(found=vs, version=vs, detail="torch.cuda.nccl.version()")


OFI_DIRS = ["/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/aws-ofi-nccl/lib",
            "/opt/aws-ofi-nccl/install/lib", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu"]
OFI_NAMES = ["libnccl-net.so", "libnccl-net-ofi.so", "libnccl-ofi.so"]


def probe_aws_ofi_nccl(ld_library_path: str = "") -> Finding:
    """aws-ofi-nccl plugin library on the usual paths and LD_LIBRARY_PATH; version from its strings."""
    dirs = [d for d in ld_library_path.split(":") if d] + OFI_DIRS
    for d in dirs:
        for name in OFI_NAMES:
            path = os.path.join(d, name)
            if not os.path.exists(path):
                continue
            version = None
            try:
                data = open(path, "rb").read(64 * 1024 * 1024)
                m = re.search(rb"aws-ofi-nccl[ -]v?(\d+\.\d+\.\d+[\w.+-]*)", data) or re.search(
                    rb"\b(\d+\.\d+\.\d+-aws)\b", data)
                version = m.group(1).decode() if m else None
            except OSError:
                pass
            if version is None and (m2 := re.search(r"ofi-nccl[-/]v?(\d+\.\d+\.\d+)", os.path.realpath(path))):
                version = m2.group(1)
            return Finding(found=f"{version or 'version unknown'} ({path})", version=version, detail=path)
    return Finding(found=None, detail=f"no {'/'.join(OFI_NAMES)} in {', '.join(dirs[:8])}")


def probe_python_package(dist_names: list[str], module: str) -> Finding:
    import importlib.metadata as md
    import importlib.util

    for name in dist_names:
        try:
            v = md.version(name)
            return Finding(found=f"{name} {v}", version=v)
        except md.PackageNotFoundError:
            continue
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        return Finding(found=f"{module} importable from {spec.origin or spec.submodule_search_locations}",
                       detail="no package metadata: version unknown")
    return Finding(found=None, detail=f"neither {', '.join(dist_names)} installed nor `{module}` importable")


def probe_instance_type() -> str | None:
    """EC2 instance type from DMI (``/sys/devices/virtual/dmi/id/product_name`` is e.g. ``p5.48xlarge``)."""
    try:
        name = open("/sys/devices/virtual/dmi/id/product_name").read().strip()
    except OSError:
        return None
    return name if re.fullmatch(r"[a-z][a-z0-9-]*\.[a-z0-9]+", name) else None
