"""A task of a researcher's own package: sequence classification with label smoothing (0.1, as torch's
`cross_entropy(label_smoothing=0.1)` and `optax.smooth_labels` define it). It reuses the built-in task's data, head
and metrics and gives each framework its own loss; `[task] name = "smoothing:TASK"` trains it."""

from tpuplex.tasks.sequence_classification import SequenceClassification

SMOOTHING = 0.1


class SmoothedClassification(SequenceClassification):
    name = "smoothed_classification"
    backends = {framework: f"smoothing_{framework}:Module" for framework in ("jax", "tf", "torch")}


TASK = SmoothedClassification()
