"""BERT (`BertForSequenceClassification`): the pooler `tanh(dense(h[CLS]))`, dropout, `classifier`."""

from tpuplex.models.family import Family, bert_style_modules, read_bert_style

BERT = Family(
    model_types=("bert",),
    classifiers=("BertForSequenceClassification",),
    prefix="bert",
    modules={**bert_style_modules("bert"), "head.dense": "bert.pooler.dense", "head.out": "classifier"},
    read=lambda config: read_bert_style(config, "bert"),
)
