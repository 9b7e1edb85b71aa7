"""ResNet and ViT on the torch backend: HF transformers' own classes (channels-last) with the core's weights,
equal to transformers' logits, and checkpoints every backend reads (tests/common/image_family_checks.py)."""

from __future__ import annotations

import types

import image_family_checks as checks
import numpy as np
import pytest
import transformers

import torch
from tpuplex.config import RuntimeConfig
from tpuplex.errors import TpuplexError
from tpuplex.testing.specs import image_family_spec
from tpuplex_torch import step
from tpuplex_torch.backend import TorchBackend


def test_logits_equal_transformers(tmp_path):
    checks.check_logits_equal_hf(lambda: TorchBackend(RuntimeConfig(device="cpu")), tmp_path)


def test_cifar_stem_keeps_hf_names(tmp_path):
    """The CIFAR stem (3x3 at stride 1, no max-pool) differs from HF's only in the stem convolution's shape."""
    folder = checks.write_config(tmp_path, checks.TRAINING["resnet-cifar"])
    spec = image_family_spec(folder, checks.NUM_LABELS)
    backend = TorchBackend(RuntimeConfig(device="cpu"))
    state = backend.init(spec, checks.OPTIMIZER)
    assert state.model.get_parameter("resnet.embedder.embedder.convolution.weight").shape == (8, 3, 3, 3)
    assert backend.state_to_arrays(state).params.keys() == spec.params.keys()


def test_images_stay_channels_last(tmp_path):
    """The NHWC host batch reaches the convolutions as a channels-last view, not a copy per step."""
    folder = checks.write_config(tmp_path, checks.CONFIGS["resnet-basic"])
    backend = TorchBackend(RuntimeConfig(device="cpu"))
    state = backend.init(image_family_spec(folder, checks.NUM_LABELS), checks.OPTIMIZER)
    pixels = state.task.model_inputs({"images": torch.from_numpy(checks.images(2))})[0]
    assert pixels.shape == (2, 3, checks.SIZE, checks.SIZE)
    assert pixels.is_contiguous(memory_format=torch.channels_last)
    weight = state.model.get_parameter("resnet.embedder.embedder.convolution.weight")
    assert weight.is_contiguous(memory_format=torch.channels_last)


def test_trained_statistics_are_in_the_portable_state(tmp_path):
    folder = checks.write_config(tmp_path, checks.TRAINING["resnet-cifar"])
    spec = image_family_spec(folder, checks.NUM_LABELS, dropout=False)
    losses, state = checks.train(TorchBackend(RuntimeConfig(device="cpu")), spec, steps=3)
    moved = [name for name, value in state.buffers.items() if name.endswith("running_mean") and np.abs(value).max()]
    assert len(moved) == sum(name.endswith("running_mean") for name in spec.buffers) and all(np.isfinite(losses))
    assert {int(v) for k, v in state.buffers.items() if k.endswith("num_batches_tracked")} == {3}


def test_cross_replica_batch_norm_refused_on_cpu_processes(tmp_path, monkeypatch):
    folder = checks.write_config(tmp_path, checks.TRAINING["resnet-cifar"])
    backend = TorchBackend(RuntimeConfig(device="cpu"))
    monkeypatch.setattr(backend.placement, "row_processes", 2)
    with pytest.raises(TpuplexError, match="per_replica"):
        backend.init(image_family_spec(folder, checks.NUM_LABELS), checks.OPTIMIZER)


def test_sgd_resumes_exactly(tmp_path):
    checks.check_sgd_follows_torch_and_resumes(lambda: TorchBackend(RuntimeConfig(device="cpu")), tmp_path)


def test_a_family_exports_as_a_torch_program(tmp_path):
    folder = checks.write_config(tmp_path / "model", checks.CONFIGS["resnet-basic"])
    backend = TorchBackend(RuntimeConfig(device="cpu"))
    spec = checks.spec_with_statistics(folder)
    state = backend.init(spec, checks.OPTIMIZER)
    pixels = checks.images(4)
    logits = backend.predict(state, {"images": pixels})
    data = types.SimpleNamespace(image_shape=(checks.SIZE, checks.SIZE, 3), classes=("a", "b", "c"))
    (tmp_path / "exported").mkdir()
    backend.export(state, "torch_export", tmp_path / "exported", data)
    program = torch.export.load(tmp_path / "exported" / "model.pt2").module()
    with torch.no_grad():
        probabilities, classes = program(torch.from_numpy(pixels))
    np.testing.assert_allclose(probabilities.numpy(), torch.from_numpy(logits).softmax(-1).numpy(), atol=1e-6)
    assert classes.tolist() == logits.argmax(-1).tolist()


def test_bf16_trains_as_float32_does(tmp_path):
    checks.check_bf16_follows_float32(lambda: TorchBackend(RuntimeConfig(device="cpu")), tmp_path)


def test_an_hf_checkpoint_folder_starts_from_its_weights(tmp_path):
    """A folder transformers saved (config.json + model.safetensors): its weights and statistics are the initial
    state, logits equal; a checkpoint with another number of classes keeps the backbone, draws the classifier."""
    config = transformers.ResNetConfig(**{k: v for k, v in checks.CONFIGS["resnet-basic"].items()
                                          if k != "model_type"}, num_labels=checks.NUM_LABELS)
    torch.manual_seed(0)
    hf = transformers.ResNetForImageClassification(config).eval()
    for module in hf.modules():  # statistics away from 0 and 1, so the saved ones are the ones used
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    hf.save_pretrained(tmp_path / "saved")
    spec = image_family_spec(tmp_path / "saved", checks.NUM_LABELS)
    saved = hf.state_dict()
    assert all(np.array_equal(value, saved[name].numpy()) for name, value in {**spec.params, **spec.buffers}.items())
    backend = TorchBackend(RuntimeConfig(device="cpu"))
    pixels = checks.images(4)
    with torch.no_grad():
        expected = hf(torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255.0).logits.numpy()
    np.testing.assert_allclose(backend.predict(backend.init(spec, checks.OPTIMIZER), {"images": pixels}), expected,
                               atol=1e-5)
    five = image_family_spec(tmp_path / "saved", 5)
    assert five.params["classifier.1.weight"].shape == (5, 16)
    backbone = [name for name in spec.params if not name.startswith("classifier.")]
    assert all(np.array_equal(five.params[name], spec.params[name]) for name in backbone)


def test_a_fused_update_restores_and_trains_channels_last_kernels(tmp_path, monkeypatch):
    """AdamW is fused, and its kernel takes every tensor of a parameter in one layout (CUDA refuses others):
    restored moments have their parameter's strides (channels-last convolution kernels). torch's CPU fused kernel
    does not check the layout, so the strides are checked here, and the losses against the foreach update (what
    XLA runs), through a resume."""
    spec = image_family_spec(checks.write_config(tmp_path / "resnet", checks.TRAINING["resnet-cifar"]),
                             checks.NUM_LABELS, dropout=False)
    monkeypatch.setattr(step, "fused_update", lambda model: False)
    foreach, _ = checks.train(TorchBackend(RuntimeConfig(device="cpu")), spec, steps=4, resume_at=2)
    monkeypatch.undo()
    backend = TorchBackend(RuntimeConfig(device="cpu"))
    fused, _ = checks.train(backend, spec, steps=4, resume_at=2)
    np.testing.assert_allclose(fused, foreach, rtol=1e-5)
    state = backend.init(spec, checks.OPTIMIZER)
    assert state.optimizer.defaults["fused"]
    kernels = [p for p in state.model.parameters() if p.dim() == 4]
    assert kernels and all(p.is_contiguous(memory_format=torch.channels_last) for p in kernels)
    for parameter in state.model.parameters():
        moments = state.optimizer.state[parameter]
        assert moments["exp_avg"].stride() == moments["exp_avg_sq"].stride() == parameter.stride()
