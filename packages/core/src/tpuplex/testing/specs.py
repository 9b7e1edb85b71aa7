"""ModelSpecs for tests: a checkpoint's model with a task's head (sequence classification, masked LM, token
classification, image classification), as `tpuplex.run.prepare` builds them (heads and initial parameters from
the core)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuplex import models
from tpuplex.params import initial_image_state, initial_params, read_hf_config
from tpuplex.protocol import ModelSpec
from tpuplex.tasks.base import Head
from tpuplex.tasks.image_classification import TASK as IMAGE_CLASSIFICATION
from tpuplex.tasks.masked_lm import TASK as MASKED_LM
from tpuplex.tasks.masked_lm.heads import masked_lm_head
from tpuplex.tasks.sequence_classification import TASK as SEQUENCE_CLASSIFICATION
from tpuplex.tasks.sequence_classification.heads import ClassifierHead, classifier_head
from tpuplex.tasks.token_classification import TASK as TOKEN_CLASSIFICATION
from tpuplex.tasks.token_classification.heads import token_classifier_head


def classifier(hf_config: Mapping[str, Any], num_labels: int) -> Head:
    """The family's classifier head for `num_labels` outputs."""
    family, arch = models.architecture_of(hf_config)
    return classifier_head(family, arch, hf_config, num_labels)


def classifier_spec(directory: Path, hf_config: Mapping[str, Any], num_labels: int = 2, seed: int = 0,
                    **fields: Any) -> ModelSpec:
    """The checkpoint as a sequence classifier, its head drawn with `seed`."""
    head = classifier(hf_config, num_labels)
    return ModelSpec(task=SEQUENCE_CLASSIFICATION, head=head, hf_config=hf_config,
                     params=initial_params(directory, hf_config, head, seed), **fields)


def user_classifier_spec(architecture: str, num_labels: int, vocab_size: int, **fields: Any) -> ModelSpec:
    """Your own model (`model.architecture`) as a sequence classifier over `vocab_size` token ids."""
    return ModelSpec(task=SEQUENCE_CLASSIFICATION, head=classifier_head(None, None, {}, num_labels), hf_config={},
                     params={}, architecture=architecture,
                     model_arguments={"vocab_size": vocab_size, "num_labels": num_labels}, **fields)


def masked_lm_spec(directory: Path, hf_config: Mapping[str, Any], seed: int = 0, **fields: Any) -> ModelSpec:
    """The checkpoint with its family's masked-LM head (missing parts drawn with `seed`)."""
    head = masked_lm_head(*models.architecture_of(hf_config))
    return ModelSpec(task=MASKED_LM, head=head, hf_config=hf_config,
                     params=initial_params(directory, hf_config, head, seed), **fields)


def token_classifier_spec(directory: Path, hf_config: Mapping[str, Any], num_labels: int, seed: int = 0,
                          **fields: Any) -> ModelSpec:
    """The checkpoint as a token classifier for `num_labels` tags, its head drawn with `seed`."""
    head = token_classifier_head(*models.architecture_of(hf_config), hf_config, num_labels)
    return ModelSpec(task=TOKEN_CLASSIFICATION, head=head, hf_config=hf_config,
                     params=initial_params(directory, hf_config, head, seed), **fields)


def image_family_spec(directory: Path, num_labels: int = 3, seed: int = 0, **fields: Any) -> ModelSpec:
    """The ResNet or ViT that `directory`'s config.json describes as an image classifier, its parameters and
    batch-norm statistics from the core (`tpuplex.params.initial_image_state`)."""
    hf_config = read_hf_config(directory)
    params, buffers = initial_image_state(directory, hf_config, num_labels, seed)
    return ModelSpec(task=IMAGE_CLASSIFICATION, head=ClassifierHead({}, {}, (), num_labels=num_labels),
                     hf_config=hf_config, params=params, buffers=buffers, checkpoint_dir=directory, **fields)
