"""Your own Keras model (`model.architecture`, `tpuplex.models.user`) as the tf backend's steps drive it."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tpuplex.errors import TpuplexError
from tpuplex.models import user
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_tf.kinds import Built, KindModule
from tpuplex_tf.ops import Variables


class UserClassifier:
    """A user's Keras model (`model.architecture`, see `tpuplex.models.user`) behind the interface `Steps` drives.

    Its variables keep their Keras layout and are named by the attributes that reach them, as torch's state dict
    names them (`convolutions.0.kernel`): Keras' own paths carry per-process counters (`text_cnn_2/conv1d_7`), so
    they could not name a checkpoint another process reads. In a train step the model runs with `training=True`
    (batch norm on the batch's statistics); with dropout off its Dropout layers have rate 0 (`build_user_model`).
    Every Keras seed generator in it is set from the step's seed first, so its dropout masks, like the built-in
    classifier's, depend only on (seed, step, replica): a resumed run draws the same ones.
    """

    def __init__(self, module: keras.Model):
        self.module = module
        self.seed_states = [v for v in module.non_trainable_variables if v.path.endswith("seed_generator_state")]

    def __call__(self, *inputs: tf.Tensor, seed: tf.Tensor | None = None) -> tf.Tensor:
        training = seed is not None
        if training:
            for index, state in enumerate(self.seed_states):
                state.assign(tf.cast(tf.random.experimental.stateless_fold_in(seed, 1000 + index), state.dtype))
        return self.module(*inputs, training=training)

    def hf_variables(self) -> Variables:
        """Attribute path -> (variable, False) for every trainable variable (user models keep their layout)."""
        named = _attribute_paths(self.module, trainable=True)
        unnamed = [v.path for v in self.module.trainable_variables if id(v) not in {id(x) for x in named.values()}]
        if unnamed:
            raise TpuplexError(f"the Keras model has trainable variables no attribute reaches ({', '.join(unnamed)}): "
                               "assign every layer to an attribute (or a list attribute) of the model")
        return {name: (variable, False) for name, variable in named.items()}

    def state_variables(self) -> dict[str, keras.Variable]:
        """Attribute path -> every non-trainable variable but the seed generators' (batch-norm moving statistics):
        the model's state, which training updates and checkpoints carry."""
        seeds = {id(v) for v in self.seed_states}
        return {name: v for name, v in _attribute_paths(self.module, trainable=False).items() if id(v) not in seeds}


def _attribute_paths(layer: keras.layers.Layer, trainable: bool, prefix: str = "") -> dict[str, keras.Variable]:
    """The (non-)trainable variables of `layer` and its sublayers, named by attribute path; a shared layer once."""
    own = layer._trainable_variables if trainable else layer._non_trainable_variables  # not its sublayers'
    found = {f"{prefix}{v.name}": v for v in own}
    for attribute, value in vars(layer).items():
        if attribute.startswith("_"):
            continue
        children = [(attribute, value)] if isinstance(value, keras.layers.Layer) else \
            [(f"{attribute}.{i}", item) for i, item in enumerate(value) if isinstance(item, keras.layers.Layer)] \
            if isinstance(value, list | tuple) else []
        for name, child in children:
            for path, variable in _attribute_paths(child, trainable, f"{prefix}{name}.").items():
                if all(variable is not seen for seen in found.values()):
                    found[path] = variable
    return found


class OwnModel(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """The user's Keras model with variables drawn under `keras.utils.set_random_seed(optimizer.seed)`, checked
        to return logits [B, num_labels] for the task's `model_inputs` (called under the strategy's scope); with
        dropout off, every Dropout layer in it gets rate 0, as the torch backend sets p = 0. It starts from the
        values it drew."""
        keras.utils.set_random_seed(optimizer.seed)
        module = user.build(spec.architecture, "tf", spec.model_arguments, keras.layers.Layer, "keras.layers.Layer")
        example = {key: tf.constant(value) for key, value in spec.example_batch.items()}
        logits = module(*task.model_inputs(example))  # creates every variable
        shape = tuple(logits.shape) if isinstance(logits, tf.Tensor) else type(logits).__name__
        user.check_logits(spec.architecture, shape, len(spec.example_batch["labels"]), spec.num_labels)
        if not spec.dropout:
            for layer in module._flatten_layers():
                if isinstance(layer, keras.layers.Dropout):
                    layer.rate = 0.0
        network = UserClassifier(module)
        return Built(network, {name: np.array(variable.numpy()) for name, (variable, _) in
                               network.hf_variables().items()},
                     {name: np.array(variable.numpy()) for name, variable in network.state_variables().items()},
                     wrapped=module)
