"""Megatron-LM's iteration lines become rows of metrics.jsonl, and `clustertrain status` shows them.

The lines are not typed here: they are what Megatron-LM core_v0.16.1 prints. The tarball's
``megatron/training/training.py`` is parsed with ``ast``; the statements of ``training_log`` that build
``log_string`` (its ``log_string = ...`` / ``+=`` assignments, with the ``if`` branches and the loop over
``total_loss_dict`` around them, and the names those compute) run with values chosen here. The older formats
are derived from that line: no timestamp, a timestamp without microseconds, and ``srun --label``'s ``N: ``.
tokens/s and MFU are checked against the built-in trainer's own pieces (its GPT's parameter count, its
``flops_per_token``, ``peak_flops_for`` of the CUDA device name).
"""

from __future__ import annotations

import ast
import copy
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from clustertrain.launch.backend import JobStatus
from clustertrain.core.job_records import JobRecord, add_record
from clustertrain.megatron.logs import (ingest_megatron_log, log_sources, megatron_row, parse_line, row_context,
                                        state_path)
from clustertrain.core.run_events import read_jsonl
from clustertrain.monitor.status import RUNNING, model_status
from clustertrain.project import validate_project
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.states import State
from tests.support.megatron_lm import megatron_source
from tests.unit.monitor.test_status import make_run, run_main

ROOT = Path(__file__).resolve().parents[3]
STAMP = datetime(2026, 11, 23, 10, 0, 0, 123456)
SEQ_LEN = 1024


# -- the lines Megatron-LM prints ----------------------------------------------------------------------------------


def _sets_log_string(node: ast.AST) -> bool:
    target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
    return isinstance(node, (ast.Assign, ast.AugAssign)) and isinstance(target, ast.Name) and target.id == "log_string"


def _builds_log_string(node: ast.AST) -> bool:
    return any(_sets_log_string(n) for n in ast.walk(node))


def _keep(body: list[ast.stmt], top: bool) -> list[ast.stmt]:
    """The statements of ``body`` that build log_string: its assignments, the if/for statements holding some (pruned
    the same way) and, inside those, assignments to plain names (``avg``, ``energy``, ``power``)."""
    out: list[ast.stmt] = []
    for stmt in body:
        if _sets_log_string(stmt):
            out.append(stmt)
        elif isinstance(stmt, (ast.If, ast.For)) and _builds_log_string(stmt):
            kept = copy.copy(stmt)
            kept.body = _keep(stmt.body, False) or [ast.Pass()]
            kept.orelse = _keep(stmt.orelse, False)
            out.append(kept)
        elif not top and isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            out.append(stmt)
    return out


class _TrainingLog:
    """``training_log``'s line-building statements of one training.py, runnable with chosen values."""

    def __init__(self, training_py: Path):
        tree = ast.parse(training_py.read_text(encoding="utf-8"))
        fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "training_log")
        # the key names it defines up front ('advanced iterations', ...)
        consts = [s for s in fn.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)]
        block = next(n for n in ast.walk(fn) if isinstance(n, ast.If) and any(_sets_log_string(s) for s in n.body))
        body = _keep(block.body, True)
        self.kept = sum(1 for s in body for n in ast.walk(s) if _sets_log_string(n))
        self.written = sum(1 for n in ast.walk(fn) if _sets_log_string(n))
        self.keys: dict[str, str] = {}
        exec(compile(ast.fix_missing_locations(ast.Module(consts, [])), str(training_py), "exec"), {}, self.keys)
        self.code = compile(ast.fix_missing_locations(ast.Module(body, [])), str(training_py), "exec")

    def line(self, *, iteration: int, train_iters: int = 1000, consumed: int, step_time: float, throughput: float,
             lr: float, batch: int, losses: dict[str, float], loss_scale: float = 1.0, grad_norm: float | None,
             advanced: int = 10, skipped: int = 0, nan: int = 0, skipped_samples: int = 0, energy: float | None = None,
             num_zeros: int | None = None, params_norm: float | None = None, world: int = 16) -> str:
        class Item:  # a torch tensor's .item(), holding the sum over the interval's advanced iterations
            def __init__(self, value: float):
                self.value = value

            def item(self) -> float:
                return self.value

        class Clock(datetime):
            @classmethod
            def now(cls, tz=None):
                return STAMP

        k = self.keys
        total = {name: Item(value * advanced) for name, value in losses.items()}
        total.update({k["advanced_iters_key"]: advanced, k["skipped_iters_key"]: skipped, k["nan_iters_key"]: nan})
        iterations = advanced + skipped
        args = SimpleNamespace(train_iters=train_iters, consumed_train_samples=consumed,
                               skipped_train_samples=skipped_samples, log_throughput=True,
                               log_timers_to_tensorboard=False, log_energy=energy is not None, world_size=world)
        ns = {**k, "args": args, "datetime": Clock, "iteration": iteration, "has_rl_utils": False,
              "elapsed_time_per_iteration": step_time, "throughput": throughput, "learning_rate": lr,
              "batch_size": batch, "total_loss_dict": total, "loss_scale": loss_scale, "grad_norm": grad_norm,
              "num_zeros_in_grad": num_zeros, "params_norm": params_norm, "total_iterations": iterations,
              "should_reset": False, "writer": None, "wandb_writer": None,
              "energy_monitor": SimpleNamespace(lap=lambda: (energy or 0.0) * iterations * world)}
        exec(self.code, ns)
        return ns["log_string"]


@pytest.fixture(scope="module")
def training_log(tmp_path_factory) -> _TrainingLog:
    source = megatron_source(tmp_path_factory.mktemp("megatron-lm"))  # unpacks the tarball (tarfile)
    return _TrainingLog(source / "megatron" / "training" / "training.py")


PLAIN = dict(iteration=100, consumed=12800, step_time=0.125, throughput=400.125, lr=3e-4, batch=128,
             losses={"lm loss": 2.5}, grad_norm=1.25)
FULL = dict(iteration=250, train_iters=5000, consumed=32000, step_time=0.75, throughput=512.5, lr=1.5e-4, batch=128,
            losses={"lm loss": 2.25, "mtp_1 loss": 3.5}, loss_scale=65536.0, grad_norm=0.5, skipped=2, nan=1,
            skipped_samples=256, energy=640.5, num_zeros=7, params_norm=123.5)


def older_formats(line: str) -> dict[str, str]:
    """The line as older Megatron-LM releases print it, and as ``srun --label`` prefixes it."""
    full = STAMP.strftime("%Y-%m-%d %H:%M:%S.%f")
    assert line.startswith(f" [{full}] iteration "), line
    return {"current": line, "no timestamp": line.replace(f" [{full}]", "", 1),
            "seconds": line.replace(full, STAMP.strftime("%Y-%m-%d %H:%M:%S"), 1), "srun label": "15: " + line}


def test_the_extracted_code_is_training_logs_line(training_log):
    """The pruning kept every statement of training_log that writes log_string, and the line is Megatron's."""
    assert training_log.kept == training_log.written >= 15  # head, samples, time, throughput, lr, losses, ...
    line = training_log.line(**PLAIN)
    assert line.startswith(" [2026-11-23 10:00:00.123456] iteration      100/    1000 |"
                           " consumed samples:        12800 |")
    assert " learning rate: 3.000000E-04 | global batch size:   128 | lm loss: 2.500000E+00 | loss scale: 1.0 |" in line
    assert line.endswith(" number of skipped iterations:   0 | number of nan iterations:   0 |")


@pytest.mark.parametrize("fmt", ["current", "no timestamp", "seconds", "srun label"])
@pytest.mark.parametrize("case", ["plain", "full"])
def test_each_format_parses_to_the_values_fed_in(training_log, case, fmt):
    fed = PLAIN if case == "plain" else FULL
    line = older_formats(training_log.line(**fed))[fmt]
    parsed = parse_line(line)
    assert parsed is not None, line
    assert parsed.step == fed["iteration"] and parsed.train_iters == fed.get("train_iters", 1000)
    stamp = {"current": STAMP, "srun label": STAMP, "seconds": STAMP.replace(microsecond=0), "no timestamp": None}[fmt]
    assert parsed.time == (stamp.timestamp() if stamp else None)
    ctx = row_context(*_megatron_project_and_entry(Path("/fsx")))
    row = megatron_row(parsed, ctx, now=42.0)
    assert row["time"] == (stamp.timestamp() if stamp else 42.0)
    expect = {"step": fed["iteration"], "loss": fed["losses"]["lm loss"], "lr": fed["lr"],
              "grad_norm": fed["grad_norm"],
              "step_time_s": fed["step_time"], "consumed_samples": fed["consumed"], "global_batch": fed["batch"],
              "tflops_per_gpu": round(fed["throughput"], 1), "loss_scale": fed.get("loss_scale", 1.0),
              "skipped_iters": fed.get("skipped", 0), "nan_iters": fed.get("nan", 0),
              "tokens": fed["consumed"] * SEQ_LEN, "framework": "megatron"}
    assert {k: row[k] for k in expect} == expect
    if case == "full":
        assert row["mtp_1_loss"] == 3.5 and row["skipped_samples"] == 256 and row["num_zeros"] == 7
        assert row["params_norm"] == 123.5 and row["energy_per_gpu_j"] == 640.5
        assert row["power_per_gpu_w"] == pytest.approx(640.5 / 0.75, abs=0.05)
    else:
        assert not {"mtp_1_loss", "skipped_samples", "num_zeros", "params_norm", "energy_per_gpu_j"} & set(row)


def test_other_lines_are_not_iteration_lines(training_log):
    line = training_log.line(**PLAIN)
    for other in (" validation loss at iteration 100 on validation set | lm loss value: 2.5E+00 | lm loss PPL: 12.2 |",
                  "[before the start of training step] datetime: 2026-11-23 10:00:00",
                  "(min, max) time across ranks (ms):", "", line[: line.index(" iteration") + 10]):
        assert parse_line(other) is None, other
    assert parse_line(line.replace("lm loss: 2.500000E+00 |", "lm loss: nan |")).values["lm loss"] is None


# -- tokens/s and MFU as the trainer computes them -----------------------------------------------------------------


MEGATRON_PROJECT = """name: mg
cluster: {{backend: {backend}, nodes: {nodes}, gpus_per_node: 8{instance}}}
storage: {{root: {root}}}
models:
  - name: gpt
    framework: megatron
    model: {{layers: 4, hidden: 768, heads: 12, seq_len: %d}}
    data: {{source: "builtin:shakespeare", tokenizer: byte}}
    training: {{max_steps: 1000, micro_batch: 1, global_batch: 128}}
""" % SEQ_LEN


def _project_text(root: Path, backend: str = "local", nodes: int = 1, instance: str | None = "p5e.48xlarge") -> str:
    return MEGATRON_PROJECT.format(backend=backend, nodes=nodes, root=root,
                                   instance=f", instance_type: {instance}" if instance else "")


def megatron_project(tmp_path: Path, **kw) -> Path:
    """Write ``<tmp_path>/mg.yaml``: one Megatron model on 8-GPU nodes (default: local, one p5e.48xlarge)."""
    path = tmp_path / "mg.yaml"
    path.write_text(_project_text(tmp_path / "runs", **kw))
    return path


def _megatron_project_and_entry(root: Path, **kw):
    project = validate_project(yaml.safe_load(_project_text(root / "runs", **kw)))
    return project, project.model("gpt")


def test_tokens_per_s_and_mfu_are_the_trainers(training_log, tmp_path):
    from clustertrain.train.metrics import peak_flops_for
    from clustertrain.train.model import GPT, flops_per_token

    project, entry = _megatron_project_and_entry(tmp_path, backend="slurm", nodes=2)
    row = megatron_row(parse_line(training_log.line(**PLAIN)), row_context(project, entry))
    # the trainer: tps = global_batch x seq_len / step time; mfu = flops/token x tps / (peak x world size)
    tps = 128 * SEQ_LEN / 0.125
    per_token = flops_per_token(entry.model, GPT(entry.model, 256).num_params(non_embedding=True))
    peak_total = peak_flops_for("NVIDIA H200") * 16  # p5e.48xlarge: H200s, 2 nodes x 8
    assert row["tokens_per_s"] == round(tps, 1)
    assert row["mfu"] == round(per_token * tps / peak_total, 4) and row["mfu"] > 0
    project, entry = _megatron_project_and_entry(tmp_path / "none", instance=None)
    assert megatron_row(parse_line(training_log.line(**PLAIN)), row_context(project, entry))["mfu"] is None


# -- ingest ---------------------------------------------------------------------------------------------------------


def _lines(training_log, steps: list[int], **kw) -> str:
    return "".join(training_log.line(**{**PLAIN, "iteration": s, "consumed": s * 128, **kw}) + "\n" for s in steps)


def test_ingest_is_incremental_and_a_partial_line_waits(training_log, tmp_path):
    project, entry = _megatron_project_and_entry(tmp_path)
    paths = RunPaths(tmp_path / "run")
    log = paths.rank_log(0)
    log.parent.mkdir(parents=True)
    fourth = training_log.line(**{**PLAIN, "iteration": 40, "consumed": 40 * 128})
    log.write_text("> building the model ...\n" + _lines(training_log, [10, 20, 30]) + fourth[:60])
    assert log_sources(paths) == [log]
    assert ingest_megatron_log(paths, entry, project, [log]) == 3
    assert [r["step"] for r in read_jsonl(paths.metrics)] == [10, 20, 30]
    state = json.loads(state_path(paths).read_text())
    assert state["version"] == 1 and state["sources"][str(log)]["offset"] == log.stat().st_size - 60
    assert ingest_megatron_log(paths, entry, project, [log]) == 0  # nothing new: the cut line still waits
    with open(log, "a") as f:
        f.write(fourth[60:] + "\n" + _lines(training_log, [50]) + " [2026-11-23 10:00:01] iteration")
    assert ingest_megatron_log(paths, entry, project, [log]) == 2
    rows = read_jsonl(paths.metrics)
    assert [r["step"] for r in rows] == [10, 20, 30, 40, 50]
    assert rows[3]["loss"] == 2.5 and rows[3]["tokens"] == 40 * 128 * SEQ_LEN


def test_a_resume_from_an_earlier_checkpoint_drops_the_rows_from_its_step_on(training_log, tmp_path):
    project, entry = _megatron_project_and_entry(tmp_path)
    paths = RunPaths(tmp_path / "run")
    log = paths.rank_log(0)
    log.parent.mkdir(parents=True)
    log.write_text(_lines(training_log, [10, 20, 30, 40, 50]))
    assert ingest_megatron_log(paths, entry, project, [log]) == 5
    before = read_jsonl(paths.metrics)
    # the job was killed after step 50 and resumed from the checkpoint of step 30: Megatron logs 31 (its first
    # iteration), then 40 again with another loss
    with open(log, "a") as f:
        f.write(_lines(training_log, [31], losses={"lm loss": 2.75})
                + _lines(training_log, [40], losses={"lm loss": 3.0}))
    assert ingest_megatron_log(paths, entry, project, [log]) == 2
    rows = read_jsonl(paths.metrics)
    assert [r["step"] for r in rows] == [10, 20, 30, 31, 40]
    assert rows[:3] == before[:3] and [r["loss"] for r in rows[3:]] == [2.75, 3.0]
    # the state file lost: everything is read again and the same rows come out
    state_path(paths).unlink()
    assert ingest_megatron_log(paths, entry, project, [log]) == 7
    assert read_jsonl(paths.metrics) == rows


def test_slurm_outputs_are_read_in_job_order_and_status_shows_them(training_log, tmp_path):
    project, entry = _megatron_project_and_entry(tmp_path, backend="slurm", nodes=2)
    paths = make_run(tmp_path / "run", max_steps=1000, model="gpt")
    outputs = [tmp_path / "logs" / f"mg-gpt-{job}.out" for job in (41, 42)]
    outputs[0].parent.mkdir()
    for i, (job, out) in enumerate(zip(("41", "42"), outputs)):
        add_record(paths, JobRecord(job_id=job, model="gpt", job_name="mg-gpt", script=str(paths.root / "jobs" / "s"),
                                    output=str(out), submitted=1_795_000_000.0 + i))
    label = "".join(f"{i % 16}: {line}\n" for i, line in enumerate(_lines(training_log, [10, 20, 30]).splitlines()))
    outputs[0].write_text("srun: error: node-3: task 5: Killed\n" + label)
    outputs[1].write_text(_lines(training_log, [21, 30, 40], step_time=2.5, losses={"lm loss": 2.0}))
    assert log_sources(paths) == outputs
    st = model_status("gpt", paths.root, JobStatus("42", State.RUNNING), max_steps=1000, project=project)
    assert (st.state, st.step, st.loss, st.tokens_per_s) == (RUNNING, 40, 2.0, round(128 * SEQ_LEN / 2.5, 1))
    assert st.mfu is not None and st.mfu > 0 and not [m for m in st.missing if "Megatron" in m]
    assert [r["step"] for r in read_jsonl(paths.metrics)] == [10, 20, 21, 30, 40]
    # the built-in trainer's model is not ingested
    builtin = project.model_copy(update={"models": [entry.model_copy(update={"framework": "clustertrain"})]})
    other = make_run(tmp_path / "other", max_steps=1000, model="gpt")
    (other.logs).mkdir()
    other.rank_log(0).write_text(_lines(training_log, [10]))
    assert model_status("gpt", other.root, None, project=builtin).step is None and not other.metrics.exists()


def test_an_unreadable_output_is_one_note_and_status_goes_on(training_log, tmp_path):
    project, _ = _megatron_project_and_entry(tmp_path)
    paths = make_run(tmp_path / "run", max_steps=1000, model="gpt", steps=3)
    paths.rank_log(0).mkdir(parents=True)  # a directory where the rank's log should be: open() fails
    st = model_status("gpt", paths.root, None, project=project)
    notes = [m for m in st.missing if "Megatron" in m]
    assert len(notes) == 1 and str(paths.rank_log(0)) in notes[0] and "cannot read" in notes[0]
    assert st.step == 3  # what metrics.jsonl already had


def test_two_ingests_at_once_write_each_row_once(training_log, tmp_path):
    project_file = megatron_project(tmp_path)
    paths = RunPaths(tmp_path / "run")
    log = paths.rank_log(0)
    log.parent.mkdir(parents=True)
    steps = list(range(1, 3001))
    log.write_text(_lines(training_log, steps))
    child = ("import sys; from pathlib import Path; from clustertrain.resolve import load_project; "
             "from clustertrain.core.run_paths import RunPaths; from clustertrain.megatron.logs import ingest_megatron_log; "
             "p = load_project(sys.argv[1]); paths = RunPaths(Path(sys.argv[2])); "
             "print(ingest_megatron_log(paths, p.model('gpt'), p, [paths.rank_log(0)]))")
    procs = [subprocess.Popen([sys.executable, "-c", child, str(project_file), str(paths.root)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
    assert sorted(int(out) for out, _ in results) == [0, 3000]
    assert [r["step"] for r in read_jsonl(paths.metrics)] == steps


# -- the command ----------------------------------------------------------------------------------------------------


def test_clustertrain_status_shows_a_megatron_models_step_loss_and_speed(training_log, tmp_path, capsys):
    project_file = megatron_project(tmp_path)
    run = tmp_path / "runs" / "mg" / "gpt"
    paths = make_run(run, max_steps=1000, model="gpt")
    paths.logs.mkdir()
    paths.rank_log(0).write_text(_lines(training_log, [10, 20, 100]))
    code, out, err = run_main(["status", str(project_file), "--json"], capsys)
    assert code == 0, err
    (row,) = json.loads(out)
    assert (row["step"], row["max_steps"], row["loss"], row["tokens_per_s"]) == (100, 1000, 2.5, 1048576.0)
    assert row["step_time_s"] == 0.125 and row["eta_s"] == pytest.approx(900 * 0.125) and row["mfu"] > 0
    with open(paths.rank_log(0), "a") as f:
        f.write(_lines(training_log, [110], losses={"lm loss": 2.125}))
    code, out, err = run_main(["status", str(project_file)], capsys)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if "gpt" in ln and "110/1000" in ln)
    assert "2.1250" in line and "1,048,576" in line
    assert [r["step"] for r in read_jsonl(paths.metrics)] == [10, 20, 100, 110]


def test_the_report_reads_a_megatron_models_rows_too(training_log, tmp_path):
    from clustertrain.monitor.report import gather_model

    project, _ = _megatron_project_and_entry(tmp_path)
    paths = make_run(tmp_path / "run", max_steps=1000, model="gpt")
    paths.logs.mkdir()
    paths.rank_log(0).write_text(_lines(training_log, [10, 20]))
    data = gather_model(paths, "gpt", project, None)
    assert [r["step"] for r in data.metrics] == [10, 20] and data.summary.step == 20
    assert data.metrics[-1]["tokens_per_s"] == 1048576.0
