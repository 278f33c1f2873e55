"""Which network NCCL used, read from its debug log, and the suite's transport verdict.

With ``NCCL_DEBUG=INFO`` (``NCCL_DEBUG_SUBSYS=INIT,NET`` is enough) every process writes lines
``HOST:PID:TID [DEV] NCCL INFO <message>`` (launchers may prefix them: ``0: ``, ``[1,0]<stdout>:``).
The messages read here (NCCL ``src/init.cc`` and ``src/plugin/net/*.cc``; aws-ofi-nccl
``src/nccl_ofi_net.cpp``):

* ``Using network <name>`` — printed at every communicator's init: the network it uses. ``Libfabric``
  (aws-ofi-nccl; older plugins, or ``NCCL_NET="AWS Libfabric"``, say ``AWS Libfabric``), ``IB``, or
  ``Socket`` — NCCL's own TCP transport, the *silent* fallback when the plugin is missing or fails.
* ``NET/OFI Initializing aws-ofi-nccl 1.11.0`` (older plugins: ``NET/OFI Using aws-ofi-nccl 1.5.0aws``)
  — the plugin NCCL loaded, with its version.
* ``NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)`` (older: ``Selected Provider
  is efa (found 4 nics)``) — the libfabric provider: ``efa`` is EFA; ``tcp``/``sockets`` are not.
* ``NCCL version 2.27.7+cuda12.9``; channel lines ``... via NET/Libfabric/0/GDRDMA`` or ``via NET/Socket/0``.

* ``NET/Plugin: Could not find: libnccl-net.so`` (NCCL ``src/plugin/plugin_open.cc``, ``%s/Plugin: Could not
  find:%s``) — no net plugin library was found: the reason behind a Socket fallback, named in its verdict.

GDRCopy (:func:`gdrcopy_state`, :func:`gdrcopy_row`). The EFA path uses GDRCopy through libfabric, whose log
is not NCCL's: with ``FI_LOG_LEVEL=info`` libfabric writes ``libfabric:PID:TIME::core:core:FUNC():LINE<info>
MSG`` lines to stderr (ofiwg/libfabric ``src/log.c`` ``ofi_log``). Its CUDA memory code (``src/hmem_cuda.c``
``cuda_hmem_init``; ``src/hmem_cuda_gdrcopy.c``, libfabric >= 2.4.0, ``dlopen("libgdrapi.so")`` by bare name)
says ``Loaded GDRCopy library: <path>`` when it loaded it, ``Failed to find usable libgdrapi.so`` when the
loader found none, ``gdr_open failed!`` when the library loaded but the host's ``gdrdrv`` module is absent, and
``gdrcopy initialization failed! gdrcopy will not be used.`` after either failure. aws-ofi-nccl's own GDRCopy
use (``src/nccl_ofi_gdrcopy.cpp``, GPU-initiated networking only) logs through NCCL: ``Could not load
libgdrapi.so``, ``Failed to open gdr handle``; NCCL's (``src/include/gdrwrap.h``, only with
``NCCL_GDRCOPY_ENABLE=1``, default 0 in ``src/init.cc``) says ``GDRCOPY enabled library 2.5 driver 2.5``.
A failure line wins over a success line.

:func:`nccl_processes` groups the lines by process (``HOST:PID``); :func:`transport_rows` gives the
suite's verdict for the collectives job: on a project whose instance family uses EFA (the launch
preset says so), every process must use aws-ofi-nccl with the ``efa`` provider, and the plugin's
version must be at least the instance type's minimum (``requirements.yaml``); anything else — a
``NET/Socket`` fallback above all — is a ``fail`` with a one-line reason. :func:`one_rank_rows` is
``clustertrain image check``'s verdict on a one-rank NCCL init inside the image: the transport rows plus
GDRCopy in use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustertrain.validate.check_rows import CheckRow
from clustertrain.validate.probes import version_at_least
from clustertrain.validate.requirements import RequirementsConfig, load_requirements, minimums_for

_LINE_RE = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\] NCCL (?:INFO|WARN) (?P<msg>.*)")
_NETWORK_RE = re.compile(r"Using network (.+?)\s*$")
_PROVIDER_RE = re.compile(r"NET/OFI Selected [Pp]rovider is ([\w-]+)")
_OFI_VER_RE = re.compile(r"NET/OFI (?:Using|Initializing) aws-ofi-nccl v?(\S+)")
_NCCL_VER_RE = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_VIA_RE = re.compile(r"via NET/([A-Za-z][\w ]*?)/\d")
_PLUGIN_MISSING_RE = re.compile(r"NET/Plugin: Could not find: ?(.+?)\s*$", re.MULTILINE)
_FI_LINE_RE = re.compile(r"libfabric:\d+:\d+:[^:]*:[\w-]+:\w+:\w*\(\):\d+<\w+> ")
#: (state, pattern) in the order they are judged: a failure line wins over a success line (module docstring)
_GDRCOPY = (
    ("driver missing", re.compile(r"gdr_open failed!|Failed to open gdr handle")),
    ("not loaded", re.compile(r"Failed to find usable libgdrapi\.so|Could not load libgdrapi\.so|"
                              r"gdrcopy initialization failed")),
    ("in use", re.compile(r"Loaded GDRCopy library: ?(\S*)|GDRCOPY enabled library \S+ driver \S+")),
)


@dataclass
class NcclProcess:
    """What one process's NCCL log says about its network."""

    host: str
    pid: str
    network: str | None = None         # "Using network <name>" (the last one seen)
    provider: str | None = None        # libfabric provider chosen by aws-ofi-nccl
    plugin_version: str | None = None  # aws-ofi-nccl version

    @property
    def transport(self) -> str | None:
        """``EFA``, ``OFI (<provider>)``, ``IB``, ``Socket``, another network name, or None (not logged)."""
        return classify(self.network, self.provider)


def classify(network: str | None, provider: str | None) -> str | None:
    if network is None:
        return None
    if re.search(r"libfabric|\bofi\b", network, re.IGNORECASE):
        return "EFA" if provider in (None, "efa") else f"OFI ({provider})"
    if network.startswith("IB"):
        return "IB"
    if network.startswith("Socket"):
        return "Socket"
    return network


def nccl_processes(text: str) -> list[NcclProcess]:
    """One :class:`NcclProcess` per ``HOST:PID`` that logged NCCL lines, in order of appearance."""
    procs: dict[tuple[str, str], NcclProcess] = {}
    for line in text.splitlines():
        m = _LINE_RE.search(line)
        if not m:
            continue
        p = procs.setdefault((m["host"], m["pid"]), NcclProcess(m["host"], m["pid"]))
        msg = m["msg"]
        if n := _NETWORK_RE.search(msg):
            p.network = n.group(1)
        elif v := _PROVIDER_RE.search(msg):
            p.provider = v.group(1)
        elif v := _OFI_VER_RE.search(msg):
            p.plugin_version = v.group(1)
    return list(procs.values())


def detect_transport(text: str) -> dict:
    """The network of a whole log (nccl-tests or ours): ``{"transport": "EFA"|"OFI (<provider>)"|"IB"|"Socket"|None,
    "provider", "nccl_version", "ofi_nccl_version", "socket_fallback": bool}``. Lines without a ``HOST:PID``
    prefix (old logs) count too; when processes disagree, the worst (Socket first) is reported."""
    procs = nccl_processes(text)
    network = next((n.group(1) for n in map(_NETWORK_RE.search, text.splitlines()) if n), None)
    via = _VIA_RE.search(text)
    provider = (m.group(1) if (m := _PROVIDER_RE.search(text)) else None)
    kinds = [p.transport for p in procs if p.transport] or [classify(network or (via.group(1) if via else None), provider)]
    order = ("Socket", "IB")
    transport = next((k for k in order if k in kinds), None) or next((k for k in kinds if k), None)
    if transport is None and provider == "efa":
        transport = "EFA"
    nv, ov = _NCCL_VER_RE.search(text), _OFI_VER_RE.search(text)
    return {"transport": transport, "provider": provider, "nccl_version": nv.group(1) if nv else None,
            "ofi_nccl_version": ov.group(1) if ov else None, "socket_fallback": transport == "Socket"}


def _hosts(procs: list[NcclProcess]) -> str:
    hosts = list(dict.fromkeys(p.host for p in procs))
    return ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")


def transport_rows(logs: list[str], *, backend: str | None, efa_expected: bool, instance_type: str | None,
                   requirements: RequirementsConfig | None = None, job: str = "collectives") -> list[CheckRow]:
    """The transport verdict of a collectives run from the text of its NCCL logs (one or more files)."""
    if backend != "nccl":
        return [CheckRow(job=job, check="transport", verdict="not-applicable", found=f"{backend or '-'} (TCP)",
                         detail="gloo on CPU runs over TCP by design; the transport check is for NCCL on GPUs")]
    procs = [p for text in logs for p in nccl_processes(text)]
    named = [p for p in procs if p.network is not None]
    want = "aws-ofi-nccl (NET/OFI, 'Using network Libfabric') with provider efa on every process"
    if not efa_expected:
        kinds = sorted({p.transport or "-" for p in named})
        return [CheckRow(job=job, check="transport", verdict="pass" if named else "warn",
                         found=(f"{'/'.join(kinds)} on {len(named)} process(es)" if named else "not logged"),
                         threshold="any (no EFA on this instance type)",
                         detail="" if named else "no 'Using network' line in the NCCL log (NCCL_DEBUG=INFO)")]
    if not named:
        return [CheckRow(job=job, check="transport", verdict="fail", found="not logged", threshold=want,
                         detail="no NCCL 'Using network' line in results/collectives/nccl-*.log: cannot show that "
                                "EFA was used (was NCCL_DEBUG overridden?)")]
    bad = [p for p in named if p.transport != "EFA"]
    rows = []
    if bad:
        kinds = sorted({p.transport or "-" for p in bad})
        if "Socket" in kinds:
            why = (f"NCCL fell back to TCP sockets (NET/Socket) on {_hosts(bad)}: EFA is not used; NCCL did not load "
                   "aws-ofi-nccl (check that its library dir, /opt/amazon/ofi-nccl/lib64 or .../lib, is on "
                   "LD_LIBRARY_PATH and that NCCL_NET/NCCL_NET_PLUGIN do not name another network)")
            missing = sorted({m.group(1) for text in logs for m in _PLUGIN_MISSING_RE.finditer(text)})
            if missing:
                why += f"; the log says 'Using network Socket' after 'NET/Plugin: Could not find: {', '.join(missing)}'"
        else:
            why = f"NCCL used {'/'.join(kinds)} on {_hosts(bad)}, not aws-ofi-nccl with the efa provider"
        rows.append(CheckRow(job=job, check="transport", verdict="fail",
                             found=f"{'/'.join(kinds)} on {len(bad)}/{len(named)} process(es)", threshold=want,
                             detail=why))
    else:
        rows.append(CheckRow(job=job, check="transport", verdict="pass", threshold=want,
                             found=f"EFA ({named[0].network}, provider efa) on {len(named)}/{len(named)} process(es)",
                             detail="NCCL log: 'Using network', 'NET/OFI Selected provider is efa'"))
    ofi = [p for p in named if p.transport and p.transport != "Socket" and p.transport != "IB"]
    if ofi:
        rows.append(plugin_version_row(ofi, instance_type, requirements or load_requirements(), job))
    return rows


def plugin_version_row(procs: list[NcclProcess], instance_type: str | None, req: RequirementsConfig,
                       job: str = "collectives") -> CheckRow:
    """The aws-ofi-nccl version NCCL loaded vs the instance type's minimum (``requirements.yaml``)."""
    need = minimums_for(req, instance_type)["aws_ofi_nccl"]
    thr = f">= {need.version} ({instance_type or 'any instance type'})"
    versions = sorted({p.plugin_version for p in procs if p.plugin_version})
    if not versions:
        return CheckRow(job=job, check="aws-ofi-nccl (NCCL log)", verdict="warn", found="not logged", threshold=thr,
                        detail="no 'NET/OFI Initializing aws-ofi-nccl <version>' line")
    old = [v for v in versions if version_at_least(v, need.version) is False]
    return CheckRow(job=job, check="aws-ofi-nccl (NCCL log)", verdict="fail" if old else "pass",
                    found=", ".join(versions), threshold=thr,
                    detail=(f"aws-ofi-nccl {', '.join(old)} is older than {need.version}: {need.source}; "
                            "install a newer EFA installer / plugin" if old else f"minimum: {need.source}"))


def gdrcopy_state(text: str) -> tuple[str, str]:
    """``(state, line)`` of GDRCopy in a log (module docstring): ``driver missing``, ``not loaded``, ``in use`` or
    ``not logged``; ``line`` is the message that decided it ("" when not logged)."""
    lines = [ln for ln in text.splitlines() if _FI_LINE_RE.search(ln) or _LINE_RE.search(ln)]
    for state, pattern in _GDRCOPY:
        for line in lines:
            if pattern.search(line):
                return state, line.split("> ", 1)[-1].split(" NCCL INFO ", 1)[-1].strip()[:160]
    return "not logged", ""


def gdrcopy_row(logs: list[str], *, efa_expected: bool, job: str = "image-check") -> CheckRow:
    """GDRCopy in use by libfabric (or NCCL) in every log given; required where EFA is."""
    want = "libgdrapi.so loaded and opened (libfabric 'Loaded GDRCopy library', FI_LOG_LEVEL=info)"
    if not efa_expected:
        return CheckRow(job=job, check="gdrcopy", verdict="not-applicable", found="-", threshold=want,
                        detail="no EFA on this instance type: libfabric, which uses GDRCopy, is not NCCL's network")
    states = [gdrcopy_state(text) for text in logs] or [("not logged", "")]
    state, line = next((s for s in states if s[0] != "in use"), states[0])
    if state == "in use":
        return CheckRow(job=job, check="gdrcopy", verdict="pass", found=f"in use ({line})", threshold=want)
    why = {
        "driver missing": "libgdrapi.so loaded but the host's gdrdrv module did not open (is gdrcopy's kernel module "
                          "loaded on the node? lsmod | grep gdrdrv)",
        "not loaded": "the loader found no libgdrapi.so in the image: register GDRCopy's library dir (/opt/gdrcopy/lib) "
                      "in /etc/ld.so.conf.d and run ldconfig (clustertrain image render does)",
        "not logged": "no libfabric GDRCopy line: was FI_LOG_LEVEL=info passed, and did NCCL load aws-ofi-nccl?",
    }[state]
    return CheckRow(job=job, check="gdrcopy", verdict="fail", found=f"{state}" + (f" ({line})" if line else ""),
                    threshold=want, detail=why)


def one_rank_rows(log: str, *, efa_expected: bool, instance_type: str | None,
                  requirements: RequirementsConfig | None = None, job: str = "image-check") -> list[CheckRow]:
    """``image check``'s verdict on the output (stdout and stderr together) of a one-rank NCCL init with
    ``NCCL_DEBUG=INFO`` and ``FI_LOG_LEVEL=info``: the network (:func:`transport_rows`) and GDRCopy."""
    return transport_rows([log], backend="nccl", efa_expected=efa_expected, instance_type=instance_type,
                          requirements=requirements, job=job) + [gdrcopy_row([log], efa_expected=efa_expected, job=job)]
