"""What every rank of a rehearsal job runs in place of training: it records what it saw, meets its peers at the
rendezvous the batch script exported, and (rank 0) holds its job's nodes until the rehearsal has seen every job.

``python -m clustertrain.rehearsal.payload JOB_SPEC`` (the rank command of the model's real batch script,
:mod:`clustertrain.rehearsal.jobs`). Light on purpose: stdlib and :mod:`clustertrain.core.ranks` (the rules the
trainer applies to find its rank), as 640 of these start on a 2-core machine.

Steps of one rank:

1. its rank from the environment (:meth:`clustertrain.core.ranks.RankInfo.from_environ`, as training does);
2. local rank 0 of each node leaves a marker ``.rehearsal-<job>-<node>`` in each directory the job writes;
3. a barrier over TCP at ``MASTER_ADDR:MASTER_PORT``: rank 0 listens, every other rank connects and says who it is;
   when all ``world`` ranks are in, rank 0 answers each ``go`` (a wrong address or port shows as ranks that never
   arrive; a busy port as rank 0's bind error);
4. after the barrier every node's marker is in place: each rank looks for all of them (a directory off the shared
   file systems shows only its own node's), and for every path the job reads;
5. local rank 0 of each node writes where programs keep caches under HOME (:func:`cache_probe`): in a job with a
   container image the rank runs in the stand-in for Pyxis (:mod:`clustertrain.launch.container_view`: read-only
   root, only the mounts writable, HOME not mounted), so a cache dir off the mounts fails here as on the cluster;
6. writes its record ``<records>/rank-<rank>.json`` (atomically); rank 0 then writes ``<holding>`` and waits for the
   ``release`` file (at most ``hold_s``).

Job spec (JSON, written by the rehearsal)::

    {"model": str, "records": dir, "holding": file, "release": file, "hold_s": float, "rendezvous_s": float,
     "write": [dir, ...], "read": [path, ...], "expect_env": [name, ...],
     "secret_name_re": regex, "secret_value_re": regex}

Record (one per rank)::

    {"version": 1, "model", "node", "job_id", "rank", "world", "local_rank", "local_world", "node_rank",
     "source", "master_addr", "master_port", "job_nodes": [...], "gpus": {"CUDA_VISIBLE_DEVICES": str|null,
     "SLURM_JOB_GPUS": ..., "SLURM_STEP_GPUS": ..., "GPU_DEVICE_ORDINAL": ...},
     "env": {name: value for expect_env and the rank variables}, "env_names": [...],
     "secrets": [names of variables that look like credentials; values are never written],
     "write": {dir: {"exists": bool, "error": str|null, "missing_nodes": [...]}}, "read": {path: bool},
     "rendezvous": {"ok": bool, "error": str|null, "seen": int, "missing": [...], "duplicates": [...]},
     "caches": {dir: null | "error: path"},           # local rank 0 only (:func:`cache_probe`)
     "error": str|null}
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

from clustertrain.core.ranks import RANK_VARIABLES, RankError, RankInfo, expand_hostlist

GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL")


def _marker(job: str, node: str) -> str:
    return f".rehearsal-{job}-{node}"


def barrier(info: RankInfo, node: str, timeout: float) -> dict:
    """Step 3 of the module docstring; returns the rank's view of the rendezvous."""
    deadline = time.monotonic() + timeout
    out: dict = {"ok": False, "error": None, "seen": 0, "missing": [], "duplicates": []}
    if info.rank == 0:
        try:
            server = socket.create_server((info.master_addr, info.master_port), backlog=max(16, info.world_size))
        except OSError as err:
            out["error"] = f"rank 0 cannot listen on {info.master_addr}:{info.master_port}: {err.strerror or err}"
            return out
        peers, seen = [], {0: node}
        dup: list[int] = []
        with server:
            server.settimeout(1.0)
            while len(peers) < info.world_size - 1 and time.monotonic() < deadline:
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    continue
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                try:
                    hello = json.loads(conn.makefile("r").readline() or "{}")
                except (OSError, ValueError):
                    conn.close()
                    continue
                rank = int(hello.get("rank", -1))
                if rank in seen:
                    dup.append(rank)
                seen[rank] = hello.get("node", "?")
                peers.append(conn)
            for conn in peers:
                try:
                    conn.sendall(b"go\n")
                except OSError:
                    pass
                conn.close()
        out["seen"] = len(seen)
        out["missing"] = sorted(set(range(info.world_size)) - set(seen))
        out["duplicates"] = sorted(set(dup))
        out["ok"] = not out["missing"] and not dup
        if not out["ok"]:
            out["error"] = (f"{len(out['missing'])} of {info.world_size} ranks never reached "
                            f"{info.master_addr}:{info.master_port} within {timeout:.0f}s" if out["missing"]
                            else f"ranks {out['duplicates']} arrived twice")
        return out
    last = "no attempt"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((info.master_addr, info.master_port), timeout=2.0) as conn:
                conn.sendall((json.dumps({"rank": info.rank, "node": node}) + "\n").encode())
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                answer = conn.makefile("r").readline().strip()
            out["ok"], out["error"] = answer == "go", None if answer == "go" else f"rank 0 answered {answer!r}"
            return out
        except OSError as err:
            last = err.strerror or str(err)
            time.sleep(0.2)
    out["error"] = f"could not reach rank 0 at {info.master_addr}:{info.master_port} within {timeout:.0f}s: {last}"
    return out


def cache_probe(env: dict[str, str]) -> dict[str, str | None]:
    """Write (and remove) a file where programs in the container keep their caches: ``$XDG_CACHE_HOME`` (else
    ``~/.cache``: Hugging Face, torch extensions) and ``$TRITON_CACHE_DIR`` (else ``~/.triton/cache``:
    ``torch.compile``). Directory -> None, or the error naming the path."""
    home = env.get("HOME") or "/"
    dirs = [env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"),
            env.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")]
    out: dict[str, str | None] = {}
    for d in dict.fromkeys(dirs):
        try:
            os.makedirs(d, exist_ok=True)
            probe = os.path.join(d, f".rehearsal-probe-{os.getpid()}")
            open(probe, "w").close()
            os.unlink(probe)
            out[d] = None
        except OSError as err:
            out[d] = f"{err.strerror}: {err.filename}"
    return out


def write_json(path: str, value: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def run(spec: dict, env: dict[str, str]) -> int:
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    job = env.get("SLURM_JOB_ID", "0")
    secret_name, secret_value = re.compile(spec["secret_name_re"], re.I), re.compile(spec["secret_value_re"])
    record: dict = {"version": 1, "model": spec["model"], "node": node, "job_id": job, "error": None,
                    "gpus": {k: env.get(k) for k in GPU_VARIABLES},
                    "env": {k: env[k] for k in [*spec["expect_env"], *RANK_VARIABLES] if k in env
                            and not secret_name.search(k) and not secret_value.search(env[k])},
                    "env_names": sorted(env),
                    "secrets": sorted(k for k, v in env.items() if v and (secret_name.search(k) or secret_value.search(v)))}
    try:
        info = RankInfo.from_environ(env)
    except RankError as err:
        record["error"] = str(err)
        write_json(os.path.join(spec["records"], f"rank-{env.get('SLURM_PROCID', 'x')}-{node}.json"), record)
        return 1
    record.update(rank=info.rank, world=info.world_size, local_rank=info.local_rank, local_world=info.local_world_size,
                  node_rank=info.node_rank, source=info.source, master_addr=info.master_addr, master_port=info.master_port)
    try:
        nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", node))
    except RankError:
        nodes = [node]
    record["job_nodes"] = nodes
    errors: dict[str, str | None] = {d: None for d in spec["write"]}
    if info.local_rank == 0:
        for d in spec["write"]:
            try:
                open(os.path.join(d, _marker(job, node)), "w").close()
            except OSError as err:
                errors[d] = err.strerror or str(err)
    record["rendezvous"] = barrier(info, node, spec["rendezvous_s"])
    record["write"] = {d: {"exists": os.path.isdir(d), "error": errors[d],
                           "missing_nodes": [n for n in nodes if not os.path.exists(os.path.join(d, _marker(job, n)))]}
                       for d in spec["write"]}
    record["read"] = {p: os.path.exists(p) for p in spec["read"]}
    record["caches"] = cache_probe(env) if info.local_rank == 0 else {}
    write_json(os.path.join(spec["records"], f"rank-{info.rank}.json"), record)
    if info.rank == 0:
        open(spec["holding"], "w").close()
        deadline = time.monotonic() + spec["hold_s"]
        while not os.path.exists(spec["release"]) and time.monotonic() < deadline:
            time.sleep(0.2)
    return 0


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m clustertrain.rehearsal.payload JOB_SPEC")
    with open(argv[0]) as f:
        spec = json.load(f)
    sys.exit(run(spec, dict(os.environ)))


if __name__ == "__main__":
    main(sys.argv[1:])
