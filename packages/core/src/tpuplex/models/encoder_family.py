"""A text encoder family (BERT-like) described once: how to read its `config.json`, and the HF name of every
canonical parameter.

Adding a family is one `Family` value (see `bert.py` for the smallest) plus nothing in the backends, as long as
its network is an `Architecture`; a new building block is a switch of `Architecture` and its branch in the
forward pass written once (`tpuplex.models.encoder`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tpuplex.errors import TpuplexError
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.encoder_architecture import Architecture, canonical_shapes

ENCODER_TENSOR_ROLES = MappingProxyType({"query": "column", "key": "column", "value": "column",
                                         "intermediate": "column", "attention_output": "row", "output": "row"})
"""Each encoder block projection's tensor-parallel role (`tpuplex.sharding.TENSOR_ROLES`), over canonical names."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family.

    model_types: the `model_type` values of config.json that name it (the first is its name).
    prefix: the encoder's attribute in HF's *ForSequenceClassification (`bert`, `roberta`, ...); base-model
        checkpoints (saved without it) get it added on load.
    modules: canonical module -> HF module. Block modules are templates over `block` (the canonical index) or,
        for shared-layer families, `group` and `inner` (see `Architecture.blocks_per_group`).
    read: config.json -> Architecture.
    tensor_roles: canonical block module -> its tensor-parallel role (`ENCODER_TENSOR_ROLES` by default).
    """

    model_types: tuple[str, ...]
    prefix: str
    modules: Mapping[str, str]
    read: Callable[[ConfigReader], Architecture]
    tensor_roles: Mapping[str, str] = dataclasses.field(default_factory=lambda: ENCODER_TENSOR_ROLES)

    @property
    def name(self) -> str:
        return self.model_types[0]

    def architecture(self, hf_config: Mapping[str, Any], path: Path | str = "config.json") -> Architecture:
        arch = self.read(ConfigReader(hf_config, path))
        if arch.hidden_size % arch.num_heads:
            raise TpuplexError(f"{path}: hidden size {arch.hidden_size} is not divisible by {arch.num_heads} "
                               "attention heads: fix the checkpoint's config.json")
        return arch

    def hf_name(self, canonical: str, arch: Architecture) -> str:
        """`block.3.query.weight` -> e.g. `bert.encoder.layer.3.attention.self.query.weight`."""
        module, leaf = canonical.rsplit(".", 1)
        if module.startswith("block."):
            _, index, module = module.split(".", 2)
            group, inner = divmod(int(index), arch.blocks_per_group)
            template = self.modules[f"block.{module}"]
            return f"{template.format(block=index, group=group, inner=inner)}.{leaf}"
        return f"{self.modules[module]}.{leaf}"

    def hf_names(self, arch: Architecture) -> dict[str, str]:
        """Canonical name -> HF name for every encoder parameter."""
        return {name: self.hf_name(name, arch) for name in canonical_shapes(arch)}

    def tensor_dims(self, arch: Architecture) -> dict[str, int]:
        """HF name -> the dimension of the [out, in] weight its tensor-parallel role splits (outputs for "column",
        inputs for "row")."""
        return {self.hf_name(name, arch): 0 if self.tensor_roles[name.split(".")[2]] == "column" else 1
                for name in canonical_shapes(arch)
                if name.startswith("block.") and name.endswith(".weight") and name.split(".")[2] in self.tensor_roles}

    def hf_shapes(self, arch: Architecture) -> dict[str, tuple[int, ...]]:
        """HF name -> torch-layout shape for every encoder parameter."""
        return {self.hf_name(name, arch): shape for name, shape in canonical_shapes(arch).items()}


def bert_style_modules(prefix: str, embeddings: str = "embeddings") -> dict[str, str]:
    """The embedding and block names BERT introduced and RoBERTa, ELECTRA (and others) kept."""
    layer = f"{prefix}.encoder.layer.{{block}}"
    return {
        "embeddings.word": f"{prefix}.{embeddings}.word_embeddings",
        "embeddings.position": f"{prefix}.{embeddings}.position_embeddings",
        "embeddings.token_type": f"{prefix}.{embeddings}.token_type_embeddings",
        "embeddings.norm": f"{prefix}.{embeddings}.LayerNorm",
        "block.query": f"{layer}.attention.self.query",
        "block.key": f"{layer}.attention.self.key",
        "block.value": f"{layer}.attention.self.value",
        "block.attention_output": f"{layer}.attention.output.dense",
        "block.attention_norm": f"{layer}.attention.output.LayerNorm",
        "block.intermediate": f"{layer}.intermediate.dense",
        "block.output": f"{layer}.output.dense",
        "block.output_norm": f"{layer}.output.LayerNorm",
    }


def read_bert_style(config: ConfigReader, family: str, *, token_types: bool = True,
                    position_offset: int = 0) -> Architecture:
    """The Architecture of a config.json with BERT's keys (BERT, RoBERTa, ELECTRA)."""
    config.absolute_positions()
    hidden = config.positive("hidden_size")
    hidden_dropout = config.get("hidden_dropout_prob", float, 0.1)
    embedding_size = config.positive("embedding_size", hidden)
    return Architecture(
        family=family, vocab_size=config.positive("vocab_size"), embedding_size=embedding_size,
        hidden_size=hidden, num_heads=config.positive("num_attention_heads"),
        intermediate_size=config.positive("intermediate_size"),
        max_positions=config.positive("max_position_embeddings"),
        type_vocab_size=config.positive("type_vocab_size", 2), token_types=token_types,
        position_offset=position_offset, layer_norm_eps=config.get("layer_norm_eps", float, 1e-12),
        hidden_act=config.activation("hidden_act", "gelu"), embedding_projection=embedding_size != hidden,
        block_schedule=tuple(range(config.layers("num_hidden_layers"))), blocks_per_group=1,
        embedding_dropout=hidden_dropout,
        attention_dropout=config.get("attention_probs_dropout_prob", float, 0.1),
        attention_output_dropout=hidden_dropout, ffn_output_dropout=hidden_dropout,
        initializer_range=config.get("initializer_range", float, 0.02),
    )
