"""DistilBERT: its own config keys and names, no token types, no pooler.

Dropout follows
the embeddings and the feed-forward block, not the attention output. Sinusoidal position tables are refused: HF
keeps them frozen, which the shared update rule has no notion of.
"""

from tpuplex.errors import TpuplexError
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.encoder_architecture import Architecture
from tpuplex.models.encoder_family import Family

_LAYER = "distilbert.transformer.layer.{block}"


def _read(config: ConfigReader) -> Architecture:
    if config.get("sinusoidal_pos_embds", bool, False):
        raise TpuplexError(f"sinusoidal_pos_embds = true in {config.path} is not supported: tpuplex trains "
                           "learned position embeddings (use a checkpoint with sinusoidal_pos_embds = false)")
    dim, dropout = config.positive("dim"), config.get("dropout", float, 0.1)
    return Architecture(
        family="distilbert", vocab_size=config.positive("vocab_size"), embedding_size=dim, hidden_size=dim,
        num_heads=config.positive("n_heads"), intermediate_size=config.positive("hidden_dim"),
        max_positions=config.positive("max_position_embeddings"), type_vocab_size=0, token_types=False,
        position_offset=0, layer_norm_eps=1e-12, hidden_act=config.activation("activation", "gelu"),
        embedding_projection=False, block_schedule=tuple(range(config.layers("n_layers"))), blocks_per_group=1,
        embedding_dropout=dropout,
        attention_dropout=config.get("attention_dropout", float, 0.1), attention_output_dropout=0.0,
        ffn_output_dropout=dropout,
        initializer_range=config.get("initializer_range", float, 0.02),
    )


DISTILBERT = Family(
    model_types=("distilbert",),
    prefix="distilbert",
    modules={
        "embeddings.word": "distilbert.embeddings.word_embeddings",
        "embeddings.position": "distilbert.embeddings.position_embeddings",
        "embeddings.norm": "distilbert.embeddings.LayerNorm",
        "block.query": f"{_LAYER}.attention.q_lin",
        "block.key": f"{_LAYER}.attention.k_lin",
        "block.value": f"{_LAYER}.attention.v_lin",
        "block.attention_output": f"{_LAYER}.attention.out_lin",
        "block.attention_norm": f"{_LAYER}.sa_layer_norm",
        "block.intermediate": f"{_LAYER}.ffn.lin1",
        "block.output": f"{_LAYER}.ffn.lin2",
        "block.output_norm": f"{_LAYER}.output_layer_norm",
    },
    read=_read,
)
