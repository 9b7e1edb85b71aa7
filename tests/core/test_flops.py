"""Model FLOPs counted by hand for one model of each kind, the peaks of known chips, and the MFU a run reports."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpuplex import flops, models
from tpuplex.hardware import Topology
from tpuplex.kinds.decoder import Decoders
from tpuplex.kinds.image import ImageFamilies
from tpuplex.kinds.own import OwnModel
from tpuplex.kinds.text import TextEncoders
from tpuplex.protocol import ModelSpec
from tpuplex.tasks.causal_lm import TASK as CAUSAL_LM
from tpuplex.tasks.image_classification import TASK as IMAGE_CLASSIFICATION
from tpuplex.tasks.masked_lm import TASK as MASKED_LM
from tpuplex.tasks.masked_lm.heads import masked_lm_head
from tpuplex.tasks.sequence_classification import TASK as SEQUENCE_CLASSIFICATION
from tpuplex.tasks.sequence_classification.heads import ClassifierHead, classifier_head

BERT = {"model_type": "bert", "vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 8, "max_position_embeddings": 16}


def text_spec(task, head_of) -> ModelSpec:
    family, arch = models.architecture_of(BERT)
    return ModelSpec(kind=TextEncoders(None, BERT, family, arch), task=task, head=head_of(family, arch), params={},
                     arch=arch)


def test_a_bert_classifier_step_counted_by_hand():
    spec = text_spec(SEQUENCE_CLASSIFICATION, lambda family, arch: classifier_head(family, arch, BERT, 3))
    batch = {"input_ids": np.zeros((2, 3), np.int32)}  # 2 rows of 3 tokens
    # A layer: Q, K, V, O 4 x 4 each and the FFN 4 -> 8 -> 4: 128 weights, 2 FLOPs each per token (2 x 3 tokens),
    # and attention 4 L^2 d = 4 x 9 x 4 per row. The head: pooler 4 x 4 and classifier 3 x 4, once per row.
    layer = 2 * 6 * 128 + 2 * (4 * 9 * 4)
    head = 2 * 2 * (16 + 12)
    assert flops.train_flops(spec, batch) == 3 * (2 * layer + head)


def test_the_masked_lm_head_runs_on_the_masked_positions_only():
    spec = text_spec(MASKED_LM, masked_lm_head)
    batch = {"input_ids": np.zeros((2, 3), np.int32), "masked_positions": np.zeros((2, 1), np.int32)}
    layer = 2 * 6 * 128 + 2 * (4 * 9 * 4)
    head = 2 * 2 * 1 * (4 * 4 + 10 * 4)  # transform 4 x 4 and the tied decoder 10 x 4, at 2 x 1 positions
    assert flops.train_flops(spec, batch) == 3 * (2 * layer + head)


def test_a_gpt2_step_counted_by_hand():
    config = {"model_type": "gpt2", "vocab_size": 10, "n_embd": 4, "n_layer": 1, "n_head": 2, "n_positions": 8}
    family = models.DECODER_FAMILIES[0]
    arch = family.architecture(config)
    spec = ModelSpec(kind=Decoders(None, config, family, arch), task=CAUSAL_LM, head=None, params={}, arch=arch)
    # c_attn 4 -> 12, c_proj 4 -> 4, c_fc 4 -> 16, c_proj 16 -> 4: 192 weights over 3 tokens; attention 4 x 9 x 4;
    # the tied LM head 4 -> 10 at every token.
    forward = 2 * 3 * 192 + 4 * 9 * 4 + 2 * 3 * 4 * 10
    assert flops.train_flops(spec, {"input_ids": np.zeros((1, 3), np.int32)}) == 3 * forward
    # Over a frozen base (LoRA) the backward computes the activations' gradients but no weight's: 2x the forward.
    lora = dataclasses.replace(spec, frozen=frozenset({"transformer.h.0.attn.c_attn.weight"}))
    assert flops.train_flops(lora, {"input_ids": np.zeros((1, 3), np.int32)}) == 2 * forward


def test_a_cifar_resnet_step_counted_by_hand():
    config = {"model_type": "resnet", "num_channels": 3, "embedding_size": 2, "hidden_sizes": [2, 4],
              "depths": [1, 1], "layer_type": "basic", "embedding_kernel_size": 3, "embedding_stride": 1,
              "embedding_pooling": False}
    family = models.IMAGE_FAMILIES[0]
    arch = family.architecture(config)
    head = ClassifierHead(modules={}, shapes={}, drawn=(), num_labels=3)
    spec = ModelSpec(kind=ImageFamilies(None, config, family, arch), task=IMAGE_CLASSIFICATION, head=head,
                     params={}, inputs=("images",), arch=arch)
    # 2 k^2 C_in C_out per output pixel. 4x4 images: stem 3 -> 2 (16 pixels); stage 0, 2 -> 2 twice (16 pixels);
    # stage 1 at stride 2 (4 pixels): 3x3 2 -> 4, 3x3 4 -> 4 and the 1x1 shortcut 2 -> 4; classifier 4 -> 3.
    per_image = (2 * 9 * 3 * 2 * 16 + 2 * (2 * 9 * 2 * 2 * 16) + 2 * 9 * 2 * 4 * 4 + 2 * 9 * 4 * 4 * 4
                 + 2 * 1 * 2 * 4 * 4 + 2 * 4 * 3)
    assert flops.train_flops(spec, {"images": np.zeros((5, 4, 4, 3), np.uint8)}) == 3 * 5 * per_image


def test_a_model_of_your_own_is_counted_by_its_framework():
    """tpuplex does not count your network: a step is 3x the forward its framework counts (`Backend.forward_flops`,
    head included), and no count gives no MFU."""
    spec = ModelSpec(kind=OwnModel(None, {}, None, None), task=SEQUENCE_CLASSIFICATION,
                     head=classifier_head(None, None, {}, 2), params={})
    batch = {"input_ids": np.zeros((2, 3), np.int32)}
    assert flops.train_flops(spec, batch, lambda: 1e6) == 3e6
    assert flops.train_flops(spec, batch, lambda: None) is None
    assert flops.rates(None, 1.0, 1e12) == {"model_tflops_per_s": None, "mfu": None}


@pytest.mark.parametrize(("chip", "count", "tflops"), [
    ("NVIDIA H100 80GB HBM3", 8, 989.0), ("NVIDIA H100 PCIe", 1, 756.0), ("NVIDIA H200", 1, 989.0),
    ("NVIDIA A100-SXM4-40GB", 4, 312.0), ("NVIDIA L4", 1, 121.0), ("TPU v4", 4, 275.0), ("TPU v5 lite", 8, 197.0),
    ("TPU v5p", 4, 459.0), ("TPU v3", 8, 61.5),
])
def test_the_peak_of_known_chips(chip, count, tflops):
    found = flops.peak(Topology(kind="gpu" if "NVIDIA" in chip else "tpu", device_count=count, chip=chip))
    assert found.flops_per_s == tflops * 1e12 * count
    assert chip in found.source


def test_an_unknown_chip_says_how_to_set_its_peak_and_a_cpu_is_measured():
    unknown = flops.peak(Topology(kind="gpu", device_count=1, chip="Some GPU"))
    assert unknown.flops_per_s == 0 and "runtime.peak_tflops" in unknown.source
    assert flops.peak(Topology(kind="gpu", device_count=2, chip="Some GPU"), 100.0).flops_per_s == 200e12
    cpu = flops.peak(Topology(kind="cpu", device_count=8, host_count=1))
    assert cpu.flops_per_s == flops.cpu_matmul_flops() > 1e9 and "measured" in cpu.source


def test_rates_are_the_flops_over_the_seconds_and_the_peak():
    assert flops.rates(6e12, 2.0, 10e12) == {"model_tflops_per_s": 3.0, "mfu": 0.3}
    assert flops.rates(6e12, 2.0, 0.0) == {"model_tflops_per_s": 3.0, "mfu": None}
    assert not flops.above_peak(6e12, 2.0, 0.0) and not flops.above_peak(None, 2.0, 1e12)


def test_an_mfu_above_the_peak_is_never_given():
    """More FLOPs a second than the peak says that the peak or the count is wrong: no MFU, the TFLOP/s stay."""
    assert flops.rates(6e12, 2.0, 3e12) == {"model_tflops_per_s": 3.0, "mfu": 1.0}
    assert flops.rates(6e12, 2.0, 2e12) == {"model_tflops_per_s": 3.0, "mfu": None}
    assert flops.above_peak(6e12, 2.0, 2e12) and not flops.above_peak(6e12, 2.0, 3e12)
