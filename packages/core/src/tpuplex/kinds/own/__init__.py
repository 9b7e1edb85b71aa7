"""Your own network (`model.architecture`, `tpuplex.models.user`), built by each framework's module here from the
task's `model_arguments` and initialised by that framework from `train.seed`.

A text task still reads model.checkpoint, for its tokenizer (and the vocabulary size the model is built with);
an image task reads nothing.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tpuplex import params
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.errors import TpuplexError
from tpuplex.kinds import ModelKind


class OwnModel(ModelKind):
    name: ClassVar[str] = "own"
    frameworks: ClassVar[dict[str, str]] = {framework: f"{__name__}.{framework}:OwnModel"
                                            for framework in ("jax", "tf", "torch")}

    @classmethod
    def resolve(cls, config: Any, task: Any) -> OwnModel:
        checkpoint_dir = params.resolve_checkpoint(config.model.checkpoint) if task.tokenized else None
        return cls(checkpoint_dir, {}, None, None)

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """None from the core: the backend's framework initialises the model (`train.seed`)."""
        return {}, {}

    def hf_class(self, config: Any, task: Any) -> str:
        raise TpuplexError(f"the run trained your own model ({config.model.architecture}), whose parameters keep "
                           "their framework's names: export hf needs a model family checkpoint (model.checkpoint)")

    def model_arguments(self, config: Any, task: Any, data: Any, head: Any) -> dict[str, Any]:
        """The task's; a text task's model gets the tokenizer's vocabulary size (its embedding table)."""
        vocab_size = (load_tokenizer(self.checkpoint_dir, config.data.max_length).get_vocab_size()
                      if self.checkpoint_dir else 0)
        return task.model_arguments(data, head, vocab_size)
