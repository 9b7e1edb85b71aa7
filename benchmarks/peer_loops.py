"""The frameworks' own fine-tuning scripts, timed the way `benchmarks/throughput.py` times tpuplex.

    python benchmarks/peer_loops.py examples/glue/configs/mrpc.toml --peer hf-trainer --pad dynamic --steps 16

Peers (each in its own environment; tpuplex-core reads the same GLUE files and tokens for all of them):
    hf-trainer   transformers 5 `Trainer` (run_glue.py): eager torch, AdamW (fused where torch has it).
    torch-loop   a plain eager loop as run_glue_no_trainer.py writes it: torch AdamW, linear schedule.
    flax-loop    transformers 4.57 `FlaxBertForSequenceClassification` as run_flax_glue.py trains it: optax
                 AdamW, a jitted step with donated state (on one device, `jit` is run_flax_glue's `pmap`).
    keras-fit    transformers 4.57 `TFBertForSequenceClassification` compiled and `fit` as run_glue.py (TF) does,
                 with `create_optimizer`.
--pad dynamic pads each batch to its longest example (DataCollatorWithPadding, the torch and TF scripts'
default); --pad max pads to data.max_length (run_glue's TPU setting and run_flax_glue's only one).

The recipe is the config's: learning rate, weight decay, warmup ratio, clip norm, global batch, max length,
dropout as in the checkpoint. The examples are the first --steps x global_batch of a seeded permutation of the
training split, trained twice (two epochs): the second epoch is timed, and the first's seconds (compilation
included) are printed beside it. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from tpuplex import checkpoints
from tpuplex import config as config_lib
from tpuplex.data.batching import padding_efficiency
from tpuplex.tasks.sequence_classification.features import load_encoded
from tpuplex.tasks.sequence_classification.glue import get_dataset


class Batches:
    """The timed examples, cut into batches of `global_batch` in order and padded as --pad says.

    Each batch: input_ids, token_type_ids, attention_mask int32 [B, L]; labels int32 [B].
    """

    def __init__(self, encoded, rows: np.ndarray, global_batch: int, pad: str):
        self.encoded, self.pad = encoded, pad
        self.rows = rows.reshape(-1, global_batch)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return (self.gather(rows) for rows in self.rows)

    def gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        encoded = self.encoded
        length = encoded.max_length if self.pad == "max" else int(encoded.lengths[rows].max())
        mask = (np.arange(length) < encoded.lengths[rows, None]).astype(np.int32)
        return {"input_ids": encoded.input_ids[rows, :length], "token_type_ids": encoded.token_type_ids[rows, :length],
                "attention_mask": mask, "labels": encoded.labels[rows]}



def hf_trainer(model_dir: Path, num_labels: int, batches: Batches, recipe) -> dict:
    """Two epochs of transformers' Trainer over the timed examples."""
    from hf_trainer_glue import training_arguments
    from transformers import AutoModelForSequenceClassification, Trainer, TrainerCallback

    import torch

    class Examples(torch.utils.data.Dataset):
        def __init__(self):
            self.rows = batches.rows.reshape(-1)

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, index):
            return int(self.rows[index])

    collated = []  # the Trainer's own batches (its sampler reshuffles the examples each epoch)

    def collate(rows: list[int]) -> dict[str, torch.Tensor]:
        collated.append(batches.gather(np.asarray(rows)))
        return {key: torch.from_numpy(np.asarray(value, np.int64)) for key, value in collated[-1].items()}

    class EpochClock(TrainerCallback):
        def __init__(self):
            self.seconds = []

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.started)

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=num_labels)
    args = training_arguments(recipe, Path("/tmp/tpuplex-peer-hf-trainer"), recipe.train.seed, num_train_epochs=2,
                              logging_steps=len(batches), remove_unused_columns=False)
    clock = EpochClock()
    trainer = Trainer(model=model, args=args, train_dataset=Examples(), data_collator=collate, callbacks=[clock])
    trainer.train()
    loss = next(entry["loss"] for entry in reversed(trainer.state.log_history) if "loss" in entry)
    timed = collated[len(batches):]
    return {"seconds": clock.seconds, "last_loss": float(loss), "programs": 0,
            "padding_efficiency": padding_efficiency(timed), "lengths": [b["input_ids"].shape[1] for b in timed]}


def torch_loop_setup(model_dir: Path, num_labels: int, train, total_steps: int, **config_overrides):
    """run_glue_no_trainer.py's (model, AdamW without decay on biases and LayerNorm weights, linear schedule);
    `config_overrides` go to `from_pretrained` (e.g. dropout rates)."""
    from transformers import AutoModelForSequenceClassification, get_scheduler

    import torch

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=num_labels, **config_overrides)
    no_decay = ("bias", "LayerNorm.weight")
    groups = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
               "weight_decay": train.weight_decay},
              {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=train.learning_rate)
    schedule = get_scheduler("linear", optimizer, int(train.warmup_ratio * total_steps), total_steps)
    return model, optimizer, schedule


def torch_loop(model_dir: Path, num_labels: int, batches: Batches, recipe) -> dict:
    """run_glue_no_trainer.py's loop (plus the recipe's gradient clipping): two epochs, the second timed."""
    import torch

    train = recipe.train
    torch.manual_seed(train.seed)
    model, optimizer, schedule = torch_loop_setup(model_dir, num_labels, train, 2 * len(batches))
    tensors = [{key: torch.from_numpy(np.asarray(value, np.int64)) for key, value in batch.items()}
               for batch in batches]
    model.train()
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        for batch in tensors:
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.clip_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        seconds.append(time.perf_counter() - started)
    return {"seconds": seconds, "last_loss": float(loss), "programs": 0}


def flax_glue_step(state, batch: dict, dropout_rng, train: bool = True):
    """run_flax_glue.py's train step: (TrainState, batch with labels, dropout key) -> (state, mean loss, next key).

    `train` = False turns the model's dropout off. `batch` loses its labels (run_flax_glue pops them too).
    """
    import optax

    import jax

    dropout_rng, next_rng = jax.random.split(dropout_rng)
    labels = batch.pop("labels")

    def loss_fn(params):
        logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=train)[0]
        if logits.shape[-1] == 1:  # run_flax_glue's mse_loss for a regression task (STS-B)
            return ((logits[..., 0] - labels) ** 2).mean()
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss, next_rng


def flax_loop(model_dir: Path, num_labels: int, batches: Batches, recipe) -> dict:
    """run_flax_glue.py's train step (jit, donated state, optax AdamW with its decay mask): two epochs."""
    import optax
    from flax import traverse_util
    from flax.training import train_state
    from transformers import FlaxBertForSequenceClassification

    import jax

    train = recipe.train
    model = FlaxBertForSequenceClassification.from_pretrained(model_dir, num_labels=num_labels, from_pt=True,
                                                              seed=train.seed)
    total = 2 * len(batches)
    warmup = int(train.warmup_ratio * total)
    schedule = optax.join_schedules([optax.linear_schedule(0.0, train.learning_rate, warmup),
                                     optax.linear_schedule(train.learning_rate, 0.0, total - warmup)], [warmup])

    def decay_mask(tree):
        flat = traverse_util.flatten_dict(tree)
        return traverse_util.unflatten_dict({path: path[-1] != "bias" and path[-2:] != ("LayerNorm", "scale")
                                             for path in flat})

    tx = optax.chain(optax.clip_by_global_norm(train.clip_norm),
                     optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=train.weight_decay,
                                 mask=decay_mask))
    state = train_state.TrainState.create(apply_fn=model.__call__, params=model.params, tx=tx)

    step = jax.jit(flax_glue_step, donate_argnums=(0,))
    rng = jax.random.PRNGKey(train.seed)
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        for batch in batches:
            state, loss, rng = step(state, batch, rng)
        loss = float(loss)
        seconds.append(time.perf_counter() - started)
    return {"seconds": seconds, "last_loss": loss, "programs": step._cache_size()}


def keras_fit(model_dir: Path, num_labels: int, batches: Batches, recipe) -> dict:
    """run_glue.py (TF)'s `compile` and `fit` with `create_optimizer`: two epochs, the second timed."""
    import tensorflow as tf
    from transformers import TFBertForSequenceClassification, create_optimizer

    train = recipe.train
    tf.keras.utils.set_random_seed(train.seed)
    model = TFBertForSequenceClassification.from_pretrained(model_dir, num_labels=num_labels, from_pt=True)
    total = 2 * len(batches)
    optimizer, _ = create_optimizer(train.learning_rate, total, int(train.warmup_ratio * total),
                                    weight_decay_rate=train.weight_decay, adam_global_clipnorm=train.clip_norm)
    model.compile(optimizer=optimizer, metrics=["accuracy"])

    def examples():
        for batch in batches:
            labels = batch.pop("labels")
            yield batch, labels

    spec = tf.TensorSpec([None, None], tf.int32)
    dataset = tf.data.Dataset.from_generator(examples, output_signature=(
        {"input_ids": spec, "token_type_ids": spec, "attention_mask": spec},
        tf.TensorSpec([None], tf.float32 if num_labels == 1 else tf.int32)))  # STS-B's labels are scores

    class EpochClock(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.started)

    clock = EpochClock()
    history = model.fit(dataset, epochs=2, callbacks=[clock], verbose=0)
    return {"seconds": clock.seconds, "last_loss": float(history.history["loss"][-1]),
            "programs": model.train_function.experimental_get_tracing_count()}


PEERS = {"hf-trainer": hf_trainer, "torch-loop": torch_loop, "flax-loop": flax_loop, "keras-fit": keras_fit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the experiment's TOML file (its recipe and task)")
    parser.add_argument("--peer", required=True, choices=PEERS)
    parser.add_argument("--pad", choices=("dynamic", "max"), default="dynamic")
    parser.add_argument("--steps", type=int, default=16, help="batches timed (each runs once untimed first)")
    parser.add_argument("--data-dir", help="folder with the task's GLUE files (default: data.data_dir, GLUE_DIR)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    recipe = config_lib.load(args.config, args.overrides)
    task = get_dataset(recipe.data.dataset)
    model_dir = checkpoints.resolve_checkpoint(recipe.model.checkpoint)
    encoded = load_encoded(task, "train", args.data_dir or recipe.data.data_dir or None, model_dir,
                           recipe.data.max_length, Path(recipe.data.cache_dir))
    size = args.steps * recipe.train.global_batch
    rows = np.random.default_rng(recipe.train.seed).permutation(len(encoded))[:size]
    batches = Batches(encoded, rows, recipe.train.global_batch, args.pad)
    timed = {"padding_efficiency": padding_efficiency(list(batches)),
             "lengths": [b["input_ids"].shape[1] for b in batches],
             **PEERS[args.peer](model_dir, task.num_labels, batches, recipe)}
    first_pass, seconds = timed["seconds"]
    print(json.dumps({
        "side": f"{args.peer}-pad-{args.pad}",
        "task": task.name,
        "steps": len(batches),
        "global_batch": recipe.train.global_batch,
        "examples_per_s": round(size / seconds, 2),
        "step_ms": round(1000 * seconds / len(batches), 1),
        "padding_efficiency": round(timed["padding_efficiency"], 4),
        "shapes": sorted(set(timed["lengths"])),
        "lengths": timed["lengths"],
        "first_pass_s": round(first_pass, 1),
        "programs": timed["programs"],
        "last_loss": round(timed["last_loss"], 4),
    }))


if __name__ == "__main__":
    main()
