"""BERT: the encoder that defined the names the others kept (its heads are the tasks', `tpuplex.tasks`)."""

from tpuplex.models.encoder_family import Family, bert_style_modules, read_bert_style

BERT = Family(
    model_types=("bert",),
    prefix="bert",
    modules=bert_style_modules("bert"),
    read=lambda config: read_bert_style(config, "bert"),
)
