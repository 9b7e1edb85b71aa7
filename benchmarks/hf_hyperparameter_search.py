"""The HF Trainer peer of `tpuplex tune`: `Trainer.hyperparameter_search(backend="optuna")` on the same checkpoint,
GLUE files, space, trials, evaluation cadence, sampler and pruner as a `[tune]` config.

    python benchmarks/hf_hyperparameter_search.py examples/glue/configs/mrpc_tune.toml --data-dir ../shared/glue/MRPC \
        --seed 1 --out runs/hf-tune

Run it where transformers 5, torch and optuna are installed. The config is read through tpuplex's own reader
(`extends` included); its `[tune.space]` becomes the Trainer's `hp_space` (log_uniform, uniform, int, choice), its
`train.max_steps` and `runtime.eval_every` the Trainer's `max_steps` and `eval_steps`, its sampler TPE seeded with
`--seed` and its pruner Optuna's median pruner after `pruner_startup_trials`, as `tpuplex tune` builds them. The
token ids are tpuplex's (the same tokenizer and cache). Prints one JSON line per trial (value, params, state, wall
seconds, from the study the Trainer stores) and a summary: the best value and the seconds per trial.
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from pathlib import Path

import numpy as np
import optuna
from hf_trainer_glue import Rows, pad_batch, training_arguments
from transformers import AutoModelForSequenceClassification, Trainer, set_seed

from tpuplex import checkpoints
from tpuplex import config as config_lib
from tpuplex.metrics import compute
from tpuplex.tasks.sequence_classification.features import load_encoded
from tpuplex.tasks.sequence_classification.glue import get_dataset

ARGUMENTS = {"train.learning_rate": "learning_rate", "train.warmup_ratio": "warmup_steps",
             "train.global_batch": "per_device_train_batch_size", "train.weight_decay": "weight_decay"}
"""The config fields the space may name, as the Trainer's arguments (a warmup below 1 is a ratio)."""


def suggest(trial: optuna.Trial, field: str, distribution: dict):
    (kind, bounds), = distribution.items()
    if kind == "log_uniform":
        return trial.suggest_float(field, *bounds, log=True)
    if kind == "uniform":
        return trial.suggest_float(field, *bounds)
    if kind == "int":
        return trial.suggest_int(field, *bounds)
    return trial.suggest_categorical(field, bounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/hf-tune"))
    args = parser.parse_args()
    search = tomllib.loads(args.config.read_text())["tune"]
    recipe = config_lib.load(args.config)
    task = get_dataset(recipe.data.dataset)
    model_dir = checkpoints.resolve_checkpoint(recipe.model.checkpoint)
    cache = Path(recipe.data.cache_dir).expanduser()
    train, dev = (load_encoded(task, split, args.data_dir, model_dir, recipe.data.max_length, cache).load()
                  for split in ("train", "dev"))
    metric = search["metric"].split(".", 1)[1]

    def model_init(trial=None):
        set_seed(recipe.train.seed)
        return AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=task.num_labels)

    def compute_metrics(prediction) -> dict[str, float]:
        return compute(task, np.asarray(prediction.predictions, np.float32), dev.labels)

    def hp_space(trial: optuna.Trial) -> dict:
        return {ARGUMENTS[field]: suggest(trial, field, distribution)
                for field, distribution in search["space"].items()}

    arguments = training_arguments(recipe, args.out, recipe.train.seed, max_steps=recipe.train.max_steps,
                                   eval_strategy="steps", eval_steps=recipe.runtime.eval_every,
                                   per_device_eval_batch_size=64)
    trainer = Trainer(model_init=model_init, args=arguments, train_dataset=Rows(train), eval_dataset=Rows(dev),
                      data_collator=pad_batch, compute_metrics=compute_metrics)
    args.out.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{(args.out / f'study-seed{args.seed}.db').resolve()}"
    started = time.perf_counter()
    best = trainer.hyperparameter_search(
        direction=search.get("direction", "maximize"), backend="optuna", hp_space=hp_space, n_trials=search["trials"],
        compute_objective=lambda metrics: metrics[f"eval_{metric}"],
        sampler=optuna.samplers.TPESampler(seed=args.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=search.get("pruner_startup_trials", 5)),
        storage=storage, study_name=f"hf-seed{args.seed}", load_if_exists=False)
    seconds = time.perf_counter() - started
    # The Trainer passes no callbacks to Optuna; the study it stored records each trial's times.
    for trial in optuna.load_study(study_name=f"hf-seed{args.seed}", storage=storage).trials:
        wall = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else None
        print(json.dumps({"trial": trial.number, "state": trial.state.name, "value": trial.value,
                          "params": trial.params, "seconds": wall}), flush=True)
    summary = {"best": best.objective, "params": best.hyperparameters, "trials": search["trials"],
               "seconds": round(seconds, 1), "seconds_per_trial": round(seconds / search["trials"], 1)}
    print(json.dumps(summary))
    (args.out / f"hf_tune-seed{args.seed}.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
