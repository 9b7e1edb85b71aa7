"""ALBERT: factorised embeddings and shared layers.

- embeddings of `embedding_size` (128), always projected to the hidden size by
  `albert.encoder.embedding_hidden_mapping_in`;
- `num_hidden_groups` groups of `inner_group_num` layers; applied layer i runs group
  `int(i / (num_hidden_layers / num_hidden_groups))`, all its inner layers in order (HF's rule, kept exactly);
- dropout after the attention output, none after the feed-forward block.
"""

from tpuplex.errors import TpuplexError
from tpuplex.models.config_reader import MAX_LAYERS, ConfigReader
from tpuplex.models.encoder_architecture import Architecture
from tpuplex.models.encoder_family import Family

_LAYER = "albert.encoder.albert_layer_groups.{group}.albert_layers.{inner}"


def _read(config: ConfigReader) -> Architecture:
    config.absolute_positions()
    layers, groups = config.layers("num_hidden_layers"), config.layers("num_hidden_groups", 1)
    inner = config.layers("inner_group_num", 1)
    if layers * inner > MAX_LAYERS:
        raise TpuplexError(f"num_hidden_layers x inner_group_num = {layers * inner} in {config.path} is more layers "
                           f"than tpuplex builds (at most {MAX_LAYERS:,}): fix the checkpoint's config.json")
    schedule = tuple(int(i / (layers / groups)) * inner + j for i in range(layers) for j in range(inner))
    hidden_dropout = config.get("hidden_dropout_prob", float, 0.0)
    return Architecture(
        family="albert", vocab_size=config.positive("vocab_size"),
        embedding_size=config.positive("embedding_size", 128), hidden_size=config.positive("hidden_size"),
        num_heads=config.positive("num_attention_heads"), intermediate_size=config.positive("intermediate_size"),
        max_positions=config.positive("max_position_embeddings"),
        type_vocab_size=config.positive("type_vocab_size", 2), token_types=True, position_offset=0,
        layer_norm_eps=config.get("layer_norm_eps", float, 1e-12),
        hidden_act=config.activation("hidden_act", "gelu_new"), embedding_projection=True,
        block_schedule=schedule, blocks_per_group=inner,
        embedding_dropout=hidden_dropout, attention_dropout=config.get("attention_probs_dropout_prob", float, 0.0),
        attention_output_dropout=hidden_dropout, ffn_output_dropout=0.0,
        initializer_range=config.get("initializer_range", float, 0.02),
    )


ALBERT = Family(
    model_types=("albert",),
    prefix="albert",
    modules={
        "embeddings.word": "albert.embeddings.word_embeddings",
        "embeddings.position": "albert.embeddings.position_embeddings",
        "embeddings.token_type": "albert.embeddings.token_type_embeddings",
        "embeddings.norm": "albert.embeddings.LayerNorm",
        "embeddings.projection": "albert.encoder.embedding_hidden_mapping_in",
        "block.query": f"{_LAYER}.attention.query",
        "block.key": f"{_LAYER}.attention.key",
        "block.value": f"{_LAYER}.attention.value",
        "block.attention_output": f"{_LAYER}.attention.dense",
        "block.attention_norm": f"{_LAYER}.attention.LayerNorm",
        "block.intermediate": f"{_LAYER}.ffn",
        "block.output": f"{_LAYER}.ffn_output",
        "block.output_norm": f"{_LAYER}.full_layer_layer_norm",
    },
    read=_read,
)
