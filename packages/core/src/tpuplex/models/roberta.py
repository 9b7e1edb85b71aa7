"""RoBERTa and XLM-R: BERT's encoder with

- position ids counted from `pad_token_id + 1` (HF numbers real tokens padding_idx + 1, padding_idx + 2, ...),
- one token type (type_vocab_size 1): segment ids are not fed.
"""

from tpuplex.models.family import Family, bert_style_modules, read_bert_style

ROBERTA = Family(
    model_types=("roberta", "xlm-roberta"),
    prefix="roberta",
    modules=bert_style_modules("roberta"),
    read=lambda config: read_bert_style(config, "roberta", token_types=False,
                                        position_offset=config.get("pad_token_id", int, 1) + 1),
)
