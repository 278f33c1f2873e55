"""The ranks' flight recorder defaults and process-group timeout (train/distributed.py)."""

from __future__ import annotations

from clustertrain.train.distributed import FLIGHT_BUFFER, apply_flight_recorder_env, flight_recorder_env


def test_the_flight_recorder_is_on_by_default_and_dumps_under_the_run_dir(tmp_path):
    environ: dict[str, str] = {"PATH": "/bin"}
    applied = apply_flight_recorder_env(tmp_path / "run", environ)
    assert applied == {k: v for k, v in environ.items() if k != "PATH"} and environ["TORCH_FR_BUFFER_SIZE"] == str(FLIGHT_BUFFER) == "2000"
    assert environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert environ["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "run" / "flight" / "rank")
    assert (tmp_path / "run" / "flight").is_dir()  # NCCL writes <prefix><rank> there; it makes no directory


def test_what_the_project_set_is_kept_under_either_name(tmp_path):
    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "mine" / "t_"),
               "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    assert apply_flight_recorder_env(tmp_path / "run", environ) == {}
    assert "TORCH_FR_BUFFER_SIZE" not in environ  # torch prefers the new name: setting it would override theirs
    assert (tmp_path / "mine").is_dir()
    assert set(flight_recorder_env(tmp_path)) == {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                                                  "TORCH_FR_DUMP_TEMP_FILE"}
