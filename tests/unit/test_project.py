"""The project file: loading, defaults, overrides and one-line errors."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clustertrain.core.errors import ConfigError
from clustertrain.project import architecture_fingerprint
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"

GOOD = """
name: demo
storage: {root: ./r}
models:
  - name: m1
    model: {layers: 2, hidden: 64, heads: 4, seq_len: 32}
    training: {max_steps: 10, micro_batch: 2, global_batch: 4}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_quickstart_loads_with_defaults():
    p = load_project(QUICKSTART)
    assert p.cluster.world_size == 2
    assert p.storage.root == (ROOT / "runs").resolve()
    m = p.models[0]
    assert m.model.ffn_dim == 4 * m.model.hidden
    assert p.dp_size(m) == 2


def test_relative_root_resolved_against_file(tmp_path):
    p = load_project(write(tmp_path, GOOD))
    assert p.storage.root == (tmp_path / "r").resolve()


def test_overrides_by_index_and_name_are_type_checked(tmp_path):
    path = write(tmp_path, GOOD)
    p = load_project(path, ["models.0.training.max_steps=40", "models.m1.training.lr=1e-3", "cluster.procs_per_node=1"])
    assert p.models[0].training.max_steps == 40
    assert p.models[0].training.lr == pytest.approx(1e-3)
    assert p.cluster.world_size == 1
    with pytest.raises(ConfigError, match=r"models\[0\]\.training\.max_steps: .*integer"):
        load_project(path, ["models.0.training.max_steps=lots"])
    with pytest.raises(ConfigError, match="neither an index"):
        load_project(path, ["models.nosuch.training.lr=1"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_project(path, ["models.0.training.lr"])


@pytest.mark.parametrize(
    "mutation, message",
    [
        ("models.0.training.max_step=5",
         r"models\[0\]\.training\.max_step: unknown key; did you mean `max_steps`\? valid keys here: max_steps"),
        ("models.0.model.heads=5", r"heads \(5\) must divide hidden \(64\); e.g. heads=4"),
        ("models.0.training.max_steps=0", r"max_steps must be a positive number of steps, got 0"),
        ("models.0.training.max_steps=-3", r"max_steps must be a positive number"),
        ("models.0.parallelism.tp=2", r"tp=2 needs zero_stage: 3"),
        ("models.0.parallelism.zero_stage=1", r"zero_stage 1 is not offered by the built-in trainer.*use zero_stage: 3"),
        ("models.0.training.precision=bf16", r"precision moved to models\[\]\.parallelism\.param_dtype"),
        ("models.0.parallelism.sequence_parallel=true", r"sequence_parallel needs tp > 1"),
        ("models.0.parallelism={zero_stage: 3, tp: 2, compile: true, recompute: selective}", r"compile with recompute: selective and tp > 1"),
        ("models.0.training.global_batch=6", r"global_batch \(6\) must be a multiple of micro_batch x dp \(2 x 2 = 4\)"),
        ("cluster.nodes=2", r"local backend runs on one node"),
        ("cluster.colour=red", r"cluster\.colour: unknown key; valid keys here: backend, nodes"),
        ("models.0.name=bad name!", r"model name 'bad name!' must be"),
    ],
)
def test_bad_values_give_one_line_naming_the_field(tmp_path, mutation, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_project(write(tmp_path, GOOD), [mutation])
    assert "\n" not in str(info.value)
    assert str(tmp_path / "p.yaml") in str(info.value)


UNTIED = "models.0.model={layers: 6, hidden: 64, heads: 4, seq_len: 32, tie_embeddings: false}"


@pytest.mark.parametrize(
    "sets, message",
    [
        (["models.0.parallelism.pp=2"], r"models\[0\]\.model\.tie_embeddings: true with pp=2: .*set model\.tie_embeddings: false"),
        ([UNTIED, "models.0.parallelism.pp=8"],
         r"models\[0\]\.parallelism\.pp: pp=8 = 8 pipeline stages but model\.layers=6: .*use pp <= 6"),
        ([UNTIED, "models.0.parallelism={pp: 2, virtual_stages: 2}"],
         r"models\[0\]\.parallelism\.virtual_stages: model\.layers=6 does not divide into pp=2 x virtual_stages=2 .*valid "
         r"virtual_stages: 1, 3"),
        ([UNTIED, "models.0.parallelism.pp=3"],
         r"models\[0\]\.parallelism\.pp: world size 2 is not divisible by tp x pp = 1 x 3 = 3; pp that fit with tp=1: 1, 2"),
        ([UNTIED, "models.0.parallelism={pp: 2, schedule: interleaved_1f1b}"],
         r"schedule interleaved_1f1b needs virtual_stages >= 2"),
        ([UNTIED, "models.0.parallelism={pp: 2, virtual_stages: 3, schedule: 1f1b}"],
         r"virtual_stages=3 runs only with schedule: interleaved_1f1b"),
        ([UNTIED, "models.0.parallelism.pp=2", "models.0.training.global_batch=2"],
         r"models\[0\]\.parallelism\.schedule: 1f1b needs at least pp=2 micro-batches per step, but global_batch / "
         r"\(micro_batch x dp\) = 1; raise training\.global_batch"),
        ([UNTIED, "models.0.parallelism={pp: 2, virtual_stages: 3}", "models.0.training.global_batch=6"],
         r"interleaved_1f1b needs a multiple of pp=2 micro-batches per step, but .* = 3"),
    ],
)
def test_impossible_pipelines_give_one_line_naming_the_field(tmp_path, sets, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_project(write(tmp_path, GOOD), sets)
    assert "\n" not in str(info.value)
    assert str(tmp_path / "p.yaml") in str(info.value)


def test_a_pipelined_builtin_model_loads(tmp_path):
    project = load_project(write(tmp_path, GOOD), [UNTIED, "models.0.parallelism={pp: 2, virtual_stages: 3}",
                                                   "models.0.training.global_batch=4"])
    par = project.models[0].parallelism
    assert (par.pp, par.virtual_stages, par.schedule) == (2, 3, "interleaved_1f1b")  # virtual stages pick the schedule


def test_yaml_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "name: demo\nmodels: [\n  - {name: x\n")
    with pytest.raises(ConfigError, match=r"p\.yaml:\d+:\d+: YAML syntax error"):
        load_project(path)


def test_missing_file_and_missing_key(tmp_path):
    with pytest.raises(ConfigError, match="project file not found"):
        load_project(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"models: required key is missing"):
        load_project(write(tmp_path, "name: demo\n"))


def test_duplicate_model_names(tmp_path):
    text = GOOD + """  - name: m1
    model: {layers: 2, hidden: 64, heads: 4, seq_len: 32}
    training: {max_steps: 10}
"""
    with pytest.raises(ConfigError, match="used twice"):
        load_project(write(tmp_path, text))


def test_fingerprint_changes_with_architecture(tmp_path):
    path = write(tmp_path, GOOD)
    a = load_project(path)
    b = load_project(path, ["models.0.model.layers=3"])
    c = load_project(path, ["models.0.training.lr=1e-2"])
    assert architecture_fingerprint(a, a.models[0]) != architecture_fingerprint(b, b.models[0])
    assert architecture_fingerprint(a, a.models[0]) == architecture_fingerprint(c, c.models[0])


def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    path = write(tmp_path, GOOD)
    proc = subprocess.run(
        [sys.executable, "-m", "clustertrain", "run", str(path), "--set", "models.0.model.heads=3"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "heads (3) must divide hidden (64)" in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "r").exists()


def test_reference_doc_is_current():
    from clustertrain.docs import project_reference

    doc = (ROOT / "docs" / "project-file.md").read_text()
    assert doc == project_reference(), "docs/project-file.md is stale: run `clustertrain config docs -o docs/project-file.md`"
    for key in ("max_steps", "checkpoint_every", "gpus_per_node", "tie_embeddings"):
        assert f"`{key}`" in doc


def test_cli_seq_len_longer_than_the_data_exits_2(tmp_path):
    path = write(tmp_path, GOOD.replace("./r", str(tmp_path / "fsx")).replace("seq_len: 32", "seq_len: 4000000"))
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "run", str(path), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "seq_len=4000000 needs 4000001 tokens per sample but builtin:shakespeare gives only" in proc.stderr
    assert "lower seq_len or add data" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_sections_live_in_their_stages_and_import_no_project_or_heavy_library():
    """project.py keeps the root; each section model is a leaf of its stage, so composing them is no cycle."""
    import ast

    from clustertrain import project
    from clustertrain.data.config import DataConfig
    from clustertrain.core.schema import StrictModel
    from clustertrain.train.config import ArchConfig, ParallelismConfig, TrainingConfig

    entry = project.ModelEntry.model_fields
    assert (entry["model"].annotation, entry["training"].annotation) == (ArchConfig, TrainingConfig)
    assert (entry["parallelism"].annotation, entry["data"].annotation) == (ParallelismConfig, DataConfig)
    sections = ("train/config.py", "data/config.py", "plan/config.py", "launch/config.py", "cloud/config.py", "cloud/limits.py")
    allowed = {"clustertrain.core.schema", "clustertrain.core.errors", "clustertrain.cloud.limits"}
    for rel in (*sections, "project.py"):
        tree = ast.parse((ROOT / "clustertrain" / rel).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        ours = {m for m in imported if m.startswith("clustertrain")}
        assert "clustertrain.core.storage_layout" not in ours, rel  # layout derives paths from a project, not the reverse
        if rel != "project.py":
            assert ours <= allowed, (rel, ours - allowed)

    def strict_models(cls: type) -> set[type]:
        out = {cls}
        for field in cls.model_fields.values():
            for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
                for sub in (arg, *getattr(arg, "__args__", ())):
                    if isinstance(sub, type) and hasattr(sub, "model_fields") and sub not in out:
                        out |= strict_models(sub)
        return out

    models = strict_models(project.Project)
    assert len(models) > 15 and all(issubclass(m, StrictModel) for m in models), [m for m in models if not issubclass(m, StrictModel)]
    code = ("import sys, clustertrain.project; "
            "print([m for m in ('torch', 'numpy', 'boto3', 'tokenizers', 'pcluster', 'jinja2') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_fingerprint_of_a_classic_model_is_the_one_earlier_checkpoints_carry(tmp_path):
    """Runs made before the Llama-family fields existed keep resuming: at their defaults the new fields are left
    out, so the fingerprint is the hash of the earlier model section's fields (written out here by hand)."""
    import hashlib
    import json

    project = load_project(write(tmp_path, GOOD))
    entry = project.models[0]
    earlier = {k: getattr(entry.model, k) for k in ("layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "mlp",
                                                    "norm", "tie_embeddings", "dropout")}
    blob = json.dumps({"project": project.name, "model": entry.name, "arch": earlier}, sort_keys=True)
    assert architecture_fingerprint(project, entry) == hashlib.sha256(blob.encode()).hexdigest()[:16]
    rope = load_project(write(tmp_path, GOOD), ["models.0.model.position=rope"])
    assert architecture_fingerprint(rope, rope.models[0]) != architecture_fingerprint(project, entry)
