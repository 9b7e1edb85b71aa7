"""Under `train.bf16` the jax train step computes in bfloat16: read from the lowered program, every matrix product
(the attention's two included) takes bfloat16 operands, and the attention's [B, heads, L, L] scores appear in no
float32 product. The CPU stand-in for the GPU's tensor cores: a float32 product here is one the chip would run at a
fraction of its bf16 rate."""

from __future__ import annotations

import re

import numpy as np
from helpers import backend, batch_of, encoded_split, model_spec

from tpuplex.protocol import OptimizerSpec

DOT = re.compile(r"stablehlo\.dot_general.*?:\s*\((tensor<[^>]*>),\s*(tensor<[^>]*>)\)")


def lowered_train_step(tiny_dir, bf16: bool) -> str:
    jax_backend = backend(1)
    state = jax_backend.init(model_spec(tiny_dir), OptimizerSpec(bf16=bf16))
    programs = jax_backend._require_init()
    rows = jax_backend._global_rows(batch_of(encoded_split(4, max_length=16)), programs, 1,
                                    ("input_ids", "token_type_ids", "attention_mask", "labels", "weight"))
    return programs.train.lower(state, rows, np.float32(1e-3), {}).as_text()


def operand_types(program: str) -> list[tuple[str, str]]:
    found = DOT.findall(program)
    assert found, "no dot_general in the lowered train step"
    return found


def test_bf16_train_step_multiplies_in_bfloat16(tiny_dir) -> None:
    products = operand_types(lowered_train_step(tiny_dir, bf16=True))
    float32 = [pair for pair in products if any("f32" in operand for operand in pair)]
    assert not float32, f"{len(float32)} of {len(products)} products take float32 operands: {float32[:4]}"
    scores = [pair for pair in products if any(re.search(r"x16x16x", operand) for operand in pair)]
    assert scores, "the attention's [B, heads, 16, 16] product is missing from the program"


def test_float32_train_step_stays_float32(tiny_dir) -> None:
    products = operand_types(lowered_train_step(tiny_dir, bf16=False))
    assert all("f32" in left and "f32" in right for left, right in products)
