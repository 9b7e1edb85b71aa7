"""ELECTRA discriminators (`ElectraForSequenceClassification`): BERT's encoder with

- embeddings of `embedding_size`, projected to the hidden size by `electra.embeddings_project` when they differ,
- no pooler: `classifier.dense` -> GELU (not tanh) -> `classifier.out_proj`, with dropout before and after.
"""

from tpuplex.models.family import Family, bert_style_modules, read_bert_style

ELECTRA = Family(
    model_types=("electra",),
    classifiers=("ElectraForSequenceClassification",),
    prefix="electra",
    modules={**bert_style_modules("electra"), "embeddings.projection": "electra.embeddings_project",
             "head.dense": "classifier.dense", "head.out": "classifier.out_proj"},
    read=lambda config: read_bert_style(config, "electra", head_activation="gelu", head_dropout_first=True),
)
