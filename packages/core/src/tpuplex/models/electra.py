"""ELECTRA: BERT's encoder with

- embeddings of `embedding_size`, projected to the hidden size by `electra.embeddings_project` when they differ.
"""

from tpuplex.models.encoder_family import Family, bert_style_modules, read_bert_style

ELECTRA = Family(
    model_types=("electra",),
    prefix="electra",
    modules={**bert_style_modules("electra"), "embeddings.projection": "electra.embeddings_project"},
    read=lambda config: read_bert_style(config, "electra"),
)
