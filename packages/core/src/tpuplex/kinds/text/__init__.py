"""Text encoder families (`tpuplex.models`: BERT, RoBERTa, DistilBERT, ELECTRA, ALBERT), each described once as
an `Architecture`, built with the task's head in each framework (`tf.py`, `jax.py`, `torch.py` here).

The initial weights are the checkpoint's, with the head's missing parts drawn by the core
(`tpuplex.params.initial_params`), so every backend starts from the same numbers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tpuplex import models, params
from tpuplex.errors import TpuplexError
from tpuplex.kinds import ModelKind


class TextEncoders(ModelKind):
    name: ClassVar[str] = "text"
    families: ClassVar[tuple[Any, ...]] = models.FAMILIES
    frameworks: ClassVar[dict[str, str]] = {framework: f"{__name__}.{framework}:TextEncoder"
                                            for framework in ("jax", "tf", "torch")}

    def check(self, config: Any, task: Any) -> None:
        if config.data.max_length > self.arch.max_length:
            raise TpuplexError(f"data.max_length = {config.data.max_length} is longer than the model's position "
                               f"embeddings cover: use data.max_length <= {self.arch.max_length}")

    def check_data(self, data: Any) -> None:
        """Token ids beyond the embedding table would index out of range deep inside a framework."""
        for split, encoded in data.splits().items():
            largest = encoded.max_token_id
            if largest >= self.arch.vocab_size:
                raise TpuplexError(f"the tokenizer in {self.checkpoint_dir} gives token id {largest} on {split}, but "
                                   f"the model has {self.arch.vocab_size} word embeddings: use the tokenizer saved "
                                   "with this model")

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return params.initial_params(self.checkpoint_dir, self.hf_config, head, seed), {}
