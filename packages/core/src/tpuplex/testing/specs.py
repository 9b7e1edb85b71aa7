"""ModelSpecs for tests: a checkpoint's model with a task's head (sequence classification, masked LM, token
classification, image classification), as `tpuplex.commands.run.prepare` builds them (the model kind's initial
state, the task's head)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuplex import models
from tpuplex.checkpoints import read_hf_config
from tpuplex.kinds.image import ImageFamilies
from tpuplex.kinds.own import OwnModel, OwnNetwork
from tpuplex.kinds.text import TextEncoders
from tpuplex.models import user
from tpuplex.nn import Network, initial_params
from tpuplex.protocol import ModelSpec
from tpuplex.tasks.base import Head, Task
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


def text_spec(directory: Path, hf_config: Mapping[str, Any], task: Task, head: Head, seed: int = 0,
              **fields: Any) -> ModelSpec:
    """The checkpoint's text encoder with `task`'s `head`, its missing parts drawn with `seed`."""
    family, arch = models.architecture_of(hf_config)
    kind = TextEncoders(directory, hf_config, family, arch)
    return ModelSpec(kind=kind, task=task, head=head, hf_config=hf_config, family=family, arch=arch,
                     params=kind.initial_state(head, seed)[0], **fields)


def classifier_spec(directory: Path, hf_config: Mapping[str, Any], num_labels: int = 2, seed: int = 0,
                    **fields: Any) -> ModelSpec:
    """The checkpoint as a sequence classifier, its head drawn with `seed`."""
    return text_spec(directory, hf_config, SEQUENCE_CLASSIFICATION, classifier(hf_config, num_labels), seed, **fields)


def user_classifier_spec(architecture: str, num_labels: int, vocab_size: int, **fields: Any) -> ModelSpec:
    """Your own model (`model.architecture`) as a sequence classifier over `vocab_size` token ids."""
    return ModelSpec(kind=OwnModel(None, {}, None, None), task=SEQUENCE_CLASSIFICATION,
                     head=classifier_head(None, None, {}, num_labels), params={}, architecture=architecture,
                     model_arguments={"vocab_size": vocab_size, "num_labels": num_labels},
                     example_batch=SEQUENCE_CLASSIFICATION.example_batch(None), **fields)


def network_classifier_spec(architecture: str, num_labels: int, vocab_size: int, seed: int = 0,
                            **fields: Any) -> ModelSpec:
    """A network written once (`tpuplex.nn.Network`) as a sequence classifier over `vocab_size` token ids, its
    parameters drawn from `seed` as `tpuplex train` draws them."""
    arguments = {"vocab_size": vocab_size, "num_labels": num_labels}
    network = user.build(architecture, "", arguments, Network, "tpuplex.nn.Network")
    return ModelSpec(kind=OwnNetwork(None, {}, None, None), task=SEQUENCE_CLASSIFICATION,
                     head=classifier_head(None, None, {}, num_labels), params=initial_params(network, seed),
                     architecture=architecture, model_arguments=arguments,
                     example_batch=SEQUENCE_CLASSIFICATION.example_batch(None), **fields)


def own_model_spec(task: Task, data: Any, architecture: str, vocab_size: int = 0, **fields: Any) -> ModelSpec:
    """Your own model (`model.architecture`) for `task` on `data`, built with the task's `model_arguments`."""
    head = task.head(None, None, {}, data)
    return ModelSpec(kind=OwnModel(None, {}, None, None), task=task, inputs=task.inputs, head=head, params={},
                     architecture=architecture, model_arguments=task.model_arguments(data, head, vocab_size),
                     example_batch=task.example_batch(data), **fields)


def masked_lm_spec(directory: Path, hf_config: Mapping[str, Any], seed: int = 0, **fields: Any) -> ModelSpec:
    """The checkpoint with its family's masked-LM head (missing parts drawn with `seed`)."""
    return text_spec(directory, hf_config, MASKED_LM, masked_lm_head(*models.architecture_of(hf_config)), seed,
                     **fields)


def token_classifier_spec(directory: Path, hf_config: Mapping[str, Any], num_labels: int, seed: int = 0,
                          **fields: Any) -> ModelSpec:
    """The checkpoint as a token classifier for `num_labels` tags, its head drawn with `seed`."""
    head = token_classifier_head(*models.architecture_of(hf_config), hf_config, num_labels)
    return text_spec(directory, hf_config, TOKEN_CLASSIFICATION, head, seed, **fields)


def image_family_spec(directory: Path, num_labels: int = 3, seed: int = 0, **fields: Any) -> ModelSpec:
    """The ResNet or ViT that `directory`'s config.json describes as an image classifier, its parameters and
    batch-norm statistics from the core (`tpuplex.kinds.image.initial_image_state`)."""
    hf_config = read_hf_config(directory)
    family, arch = models.architecture_of(hf_config)
    kind = ImageFamilies(directory, hf_config, family, arch)
    head = ClassifierHead({}, {}, (), num_labels=num_labels)
    params, buffers = kind.initial_state(head, seed)
    return ModelSpec(kind=kind, task=IMAGE_CLASSIFICATION, inputs=IMAGE_CLASSIFICATION.inputs, head=head,
                     hf_config=hf_config, family=family, arch=arch, params=params, buffers=buffers,
                     checkpoint_dir=directory, **fields)
