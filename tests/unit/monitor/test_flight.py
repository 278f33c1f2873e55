"""The flight recorder's verdict (monitor/flight.py, torch's own analyser) on dumps torch itself wrote
(fixtures/flight_gloo/README.md: three gloo ranks, rank 2 never joined the fourth all_reduce), and the watchdog
carrying it into incident.json and the verdict (monitor/hang_watchdog.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from clustertrain.core.heartbeat_files import Heartbeat, HeartbeatFile
from clustertrain.core.run_paths import RunPaths
from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.flight import analyse, dump_ranks
from clustertrain.monitor.hang_rules import judge
from clustertrain.monitor.hang_watchdog import Watchdog
from clustertrain.core.heartbeat_files import read_heartbeats

FIXTURE = Path(__file__).parent / "fixtures" / "flight_gloo"


def test_torchs_analyser_names_the_rank_that_never_joined(tmp_path):
    dumps = tmp_path / "flight"
    shutil.copytree(FIXTURE, dumps)
    v = analyse(dumps)
    assert v is not None and v.error == ""
    assert (v.ranks, v.collective, v.seq, v.dumps) == ([2], "gloo:all_reduce", 4, [0, 1, 2])
    assert v.summary() == "flight recorder (3 dumps): rank 2 never joined gloo:all_reduce #4 of 0:default_pg"


def test_gloo_dumps_with_two_groups_and_no_group_config_are_read_too(tmp_path):
    """gloo files no group config at all when there are two groups (the trainer's default and control groups)."""
    dumps = tmp_path / "flight"
    shutil.copytree(FIXTURE.with_name("flight_gloo_two_groups"), dumps)
    v = analyse(dumps)
    assert v is not None and v.error == "" and (v.ranks, v.collective, v.seq) == ([2], "gloo:all_reduce", 4)


def test_dumps_where_every_collective_completed_name_no_one(tmp_path):
    import pickle

    dumps = tmp_path / "flight"
    dumps.mkdir()
    for r in range(3):  # each rank's first three all_reduces only: all joined
        d = pickle.loads((FIXTURE / f"rank{r}").read_bytes())
        d["entries"] = [e for e in d["entries"] if e["collective_seq_id"] <= 3]
        (dumps / f"rank{r}").write_bytes(pickle.dumps(d))
    v = analyse(dumps)
    assert v is not None and v.ranks == [] and "every collective was joined" in v.summary()


def test_no_dump_is_no_verdict_and_an_unreadable_one_is_reported_not_raised(tmp_path):
    assert analyse(tmp_path / "none") is None
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0").write_bytes(b"not a pickle")
    (bad / "rank0.tmp").write_bytes(b"")  # not a dump name
    assert dump_ranks(bad) == [0]
    v = analyse(bad)
    assert v is not None and v.ranks == [] and v.error and v.summary().startswith("flight recorder: not analysed")


def test_the_watchdog_blames_the_rank_the_flight_recorder_names(tmp_path):
    """Every rank stopped at the same beat (the heartbeats blame no one); NCCL's own dumps in RUN_DIR/flight name
    rank 2: the incident carries the analysis, the verdict names rank 2 and its node."""
    paths = RunPaths(tmp_path / "run")
    config = MonitorConfig(heartbeat_s=5, hang_floor_s=5, hang_ceiling_s=30)
    t = 1_000_000.0
    for r in range(3):  # quiet since t - 60: not alive now, so the watchdog does not wait for their stacks
        f = HeartbeatFile(paths.rank_heartbeat(r))
        f.write(Heartbeat(rank=r, node=f"n{r}", beat=12, phase="collective", step=4, since=t - 100, alive=t - 60,
                          step_time_s=1.0))
        f.close()
    verdict = judge(read_heartbeats(paths), 3, t - 59, config, t - 200)
    assert verdict is not None and verdict.ranks == []
    shutil.copytree(FIXTURE, paths.root / "flight")
    dog = Watchdog(paths, config, 3, log=lambda m: None)
    incident = dog.handle(verdict, end_ranks=False)
    record = json.loads((incident.dir / "incident.json").read_text())
    assert record["version"] == 2 and record["ranks"] == [2] and record["nodes"] == ["n2"]
    assert record["flight"]["ranks"] == [2] and record["flight"]["collective"] == "gloo:all_reduce"
    assert record["flight"]["files"] == [str(paths.root / "flight" / f"rank{r}") for r in range(3)]
    assert record["message"].endswith("; flight recorder (3 dumps): rank 2 never joined gloo:all_reduce #4 of "
                                      "0:default_pg")
    assert dog.decide().exclude == ["n2"]
