"""RoBERTa and XLM-R: BERT's encoder with

- position ids counted from `pad_token_id + 1` (HF numbers real tokens padding_idx + 1, padding_idx + 2, ...),
- one token type (type_vocab_size 1): segment ids are not fed.
"""

from tpuplex.errors import TpuplexError
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.encoder_family import Family, bert_style_modules, read_bert_style


def position_offset(config: ConfigReader) -> int:
    """The first real token's position id: pad_token_id + 1, inside the position table."""
    pad, positions = config.get("pad_token_id", int, 1), config.positive("max_position_embeddings")
    if not 0 <= pad < positions - 1:
        raise TpuplexError(f"pad_token_id = {pad} in {config.path} leaves no position for a token (RoBERTa counts "
                           f"positions from pad_token_id + 1 up to max_position_embeddings = {positions}): fix the "
                           "checkpoint's config.json")
    return pad + 1

ROBERTA = Family(
    model_types=("roberta", "xlm-roberta"),
    prefix="roberta",
    modules=bert_style_modules("roberta"),
    read=lambda config: read_bert_style(config, "roberta", token_types=False, position_offset=position_offset(config)),
)
