"""tpuplex from Python (a script or a notebook), exported as `tpuplex.train`, `tpuplex.Run`, `tpuplex.devices`: the
same engine the `tpuplex` command runs, which is its client.

    config = tpuplex.Config.load("examples/glue/configs/mrpc.toml", data_dir="../shared/glue/MRPC",
                                 overrides={"train.max_steps": 20})
    run = tpuplex.train(config, backend="torch")          # a Run: its folder, results, history, checkpoints
    run.evaluate(backend="jax")["metrics"]                # the checkpoint on another backend
    run.predict([("The cat sat.", "A cat was sitting.")])  # predictions in memory: ["equivalent"]
    run.generate("ROMEO:", tokens=50)                     # a causal_lm run's continuation
    run.export("hf")                                      # the folder written
    tpuplex.Run.open("runs/mrpc-torch")                   # a finished (or interrupted) run

Bad input raises `tpuplex.TpuplexError` (`ConfigError`, `DataError`, `CheckpointError`) with the message the CLI
prints, before anything is written. An interrupt (Ctrl-C, a notebook's stop button) or SIGTERM during `train`
finishes the step, checkpoints it and raises `tpuplex.Preempted` (a KeyboardInterrupt); the same `train` call
resumes from that checkpoint. Several runs may share one process, on one backend or several (`docs/python.md`
says what a framework forbids).
"""

from __future__ import annotations

import json
import os
import reprlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuplex import hardware, tasks
from tpuplex.commands import run as run_lib
from tpuplex.commands import run_folder, workflow
from tpuplex.config import Config, Overrides
from tpuplex.engine import checkpoint
from tpuplex.engine.preemption import Preempted
from tpuplex.engine.run_log import LOG_FILE
from tpuplex.errors import CheckpointError, ConfigError, DataError, TpuplexError
from tpuplex.hardware import Topology
from tpuplex.tasks.base import Task

if TYPE_CHECKING:
    from tpuplex.commands.tune import Tuned

RESUME_HINT = "call tpuplex.train again with the same config to resume from it"
EVENTS = ("start", "train", "eval", "checkpoint", "epoch", "preempted", "error")
"""The events a run's log records (`Run.history`): a run that has not reached one yet has none of it."""


def train(config: Config | str | Path, backend: str, *, data_dir: str | Path | None = None,
          overrides: Overrides = ()) -> Run:
    """Train `config` (a Config, or the path of a TOML file) on `backend` ("torch", "jax", "tf"): the run of
    `tpuplex train`, in this process. A run folder that holds a checkpoint of the same config resumes from it."""
    if not isinstance(config, Config | str | os.PathLike):
        raise ConfigError(f"tpuplex.train takes a Config or the path of a TOML config, not {type(config).__name__} "
                          f"{reprlib.repr(config)}: e.g. tpuplex.train(\"examples/glue/configs/mrpc.toml\", \"torch\")")
    config_path = None
    if isinstance(config, Config):
        config = config.override(overrides) if overrides else config
        config = config if data_dir is None else config.override({"data.data_dir": str(data_dir)})
    else:
        config_path = Path(config)
        config = Config.load(config_path, data_dir=data_dir, overrides=overrides)
    try:
        results = run_lib.train(config, backend, config_path=config_path)
    except Preempted as stopped:
        raise stopped.resumed_by(RESUME_HINT) from None
    return Run(Path(results["output_dir"]), results=results)


def tune(config: Config | str | Path, backend: str, *, search: Mapping[str, Any] | None = None,
         storage: str | None = None, trials: int | None = None, output: str | Path | None = None,
         data_dir: str | Path | None = None, overrides: Overrides = ()) -> Tuned:
    """Search hyperparameters with Optuna, as `tpuplex tune` does (`tpuplex.commands.tune`, docs/tune.md): the
    config's [tune] table (`search` laid over it; with a Config, `search` is the whole table), every trial a run
    folder `<output>/trial-<n>`; returns what tune.json holds (`.best`, `.best_config`, `.trials`)."""
    from tpuplex.commands import tune as tune_lib

    return tune_lib.tune(config, backend, search=search, storage=storage, trials=trials, output=output,
                         data_dir=data_dir, overrides=overrides)


def devices() -> Topology:
    """The devices this machine has, as the core finds them (TPU chips, GPUs or the CPU); each backend confirms
    them when it starts (`tpuplex devices` asks every installed one)."""
    return hardware.discover()


class Run:
    """A run's folder (`runtime.output_dir`) and what can be done with its checkpoint on any backend.

    Opened on a run folder it uses the newest checkpoint that verifies (when first asked: a Run opened before
    training ends sees the checkpoint written by then); opened on one of its `checkpoints/step-*` folders, that
    checkpoint. `evaluate` and `predict` keep the model they restore on a backend for the next call there (`del run`
    lets it go).
    """

    def __init__(self, folder: Path, target: Path | None = None, results: dict[str, Any] | None = None):
        """Use `Run.open` (or `tpuplex.train`): `target` is the checkpoint folder chosen (None: the newest that
        verifies), `results` what training returned (on every process of a multi-process run)."""
        self.folder = folder
        self._target = target or folder
        self._results = results
        self._found: run_folder.Found | None = None
        self._restored: dict[tuple[str, bool], tuple[Any, Any]] = {}

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """The run in `path`: a run folder, or one of its checkpoints/step-* folders (that checkpoint is then the
        one used)."""
        if not isinstance(path, str | os.PathLike):
            raise CheckpointError(f"Run.open takes the path of a run folder, not {type(path).__name__} "
                                  f"{reprlib.repr(path)}: give runtime.output_dir of a tpuplex train run (a str or "
                                  "Path)")
        path = Path(path).expanduser()
        return cls(run_folder.folder_of(path), path)

    def __repr__(self) -> str:
        return f"Run({str(self.folder)!r})"

    @property
    def config(self) -> Config:
        """The run's config, its relative paths resolved from where it ran."""
        return self._located().config

    @property
    def checkpoint(self) -> Path:
        """The checkpoint this Run evaluates, predicts and exports with."""
        return self._located().checkpoint

    @property
    def checkpoints(self) -> list[Path]:
        """Every checkpoints/step-* folder of the run, oldest first."""
        return checkpoint.checkpoints(self.folder / "checkpoints")

    @property
    def results(self) -> dict[str, Any] | None:
        """What results.json holds (metrics, throughput, losses, topology...); None until training has finished."""
        path = self.folder / run_lib.RESULTS_FILE
        if self._results is None and path.is_file():
            self._results = json.loads(path.read_text(encoding="utf-8"))
        return self._results

    @property
    def metrics(self) -> dict[str, dict[str, float]] | None:
        """The final metrics of every evaluation split (results.json's `metrics`); None until training finished."""
        return None if self.results is None else self.results["metrics"]

    def history(self, event: str = "train") -> list[dict[str, Any]]:
        """The log's records of `event`, oldest first: "train" (step, loss: the mean over the `runtime.log_every`
        steps up to `step`, as the plain progress lines give it (the live bar shows the last step's), learning_rate,
        examples_per_s, ...),
        "eval" (step, split, metrics), "checkpoint", "epoch", "start", "preempted" or "error"."""
        path = self.folder / LOG_FILE
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        records = [json.loads(line) for line in lines if line.strip()]
        logged = {record.get("event") for record in records}
        if event not in EVENTS and event not in logged:
            named = sorted(set(EVENTS) | {name for name in logged if isinstance(name, str)})
            raise TpuplexError(f"Run.history(event={event!r}): the log has no such event; the events are "
                               f"{', '.join(named)}")
        return [record for record in records if record.get("event") == event]

    def history_frame(self, event: str = "train") -> Any:
        """`history(event)` as a pandas DataFrame (pandas must be installed)."""
        try:
            import pandas
        except ImportError:
            raise TpuplexError("Run.history_frame needs pandas: pip install pandas (or use Run.history, a list of "
                               "dicts)") from None
        return pandas.DataFrame(self.history(event))

    def evaluate(self, backend: str | None = None, split: str | None = None, data_dir: str | Path | None = None,
                 out: str | Path | None = None) -> dict[str, Any]:
        """The checkpoint's metrics on every evaluation split (or `split`) on `backend` (default: the one it
        trained on), counted as in training: `{"metrics": {split: {name: value}}, "checkpoint", "backend", ...}`,
        also written to `out` (default <run>/eval/<step>-<backend>.json)."""
        out = None if out is None else Path(out)
        if data_dir is not None:
            return workflow.evaluate(self._target, backend or self._backend(), split, str(data_dir), out)
        return workflow.evaluate_restored(self._located(), *self._restore(backend), split, out)

    def predict(self, inputs: Any, backend: str | None = None, scores: bool = False) -> Any:
        """Predictions of `inputs`, in memory, one per input: texts or (text, text) pairs -> labels (sequence
        classification); sentences (strings or word lists) -> (word, tag) pairs (token classification); image
        files -> class names; audio files -> transcripts. One input given alone (a string, a path) gives one
        prediction, as `generate` does. Runs on `backend` (default: the one it trained on).

        `scores=True`: each prediction is a record with the model's scores, as HF's pipelines give them:
        classification `{"label", "score", "scores"}` (the label, its probability, every label's probability by
        name; a regression's label and score are its value); token classification one `{"word", "tag", "score",
        "scores"}` per word; speech `{"transcript", "log_probability"}` (CTC's, over the transcript's
        alignments)."""
        if not isinstance(scores, bool):
            raise DataError(f"Run.predict(scores={reprlib.repr(scores)}): give True (records with the model's scores) "
                            "or False (the predictions alone)")
        single = isinstance(inputs, str | os.PathLike)
        config = self.config
        task = tasks.get(config.task.name)
        checked = task.prediction_inputs(config, [inputs] if single else inputs)  # before any backend starts
        if scores and type(task).scored_predictions_of is Task.scored_predictions_of:
            task.scored_predictions_of(None, None, checked)  # the task's refusal, before the backend starts
        experiment, state = self._restore(backend)
        predicted = (experiment.task.scored_predictions_of if scores else experiment.task.predictions_of)(
            experiment, state, checked)
        return predicted[0] if single else predicted

    def write_predictions(self, split: str = "test", backend: str | None = None, data_dir: str | Path | None = None,
                          out: str | Path | None = None) -> dict[str, Path]:
        """The prediction files of `split` ("test": every test file; GLUE's submission files), as
        `tpuplex predict` writes them: split -> file."""
        return workflow.predict(self._target, backend or self._backend(), split,
                                None if data_dir is None else str(data_dir), None if out is None else Path(out))

    def generate(self, prompts: str | Sequence[str], backend: str | None = None, tokens: int = 100,
                 temperature: float = 0.0, top_k: int = 0, seed: int = 0, chat: bool = False,
                 system: str | None = None, beams: int = 1, length_penalty: float = 1.0) -> str | list[str]:
        """A causal_lm run's continuation of each prompt (a string for one prompt given as a string), or a
        text-to-text run's text for each input: greedy at temperature 0, else sampled from `seed` (the same text
        on every backend); `chat`: each prompt is a user's message in the checkpoint's chat template, after the
        system message `system` when given, and the answer is returned; `beams` > 1: a text-to-text run's beam
        search, scored by log-probability / length ** length_penalty."""
        from tpuplex.commands import generate

        single = isinstance(prompts, str)
        if not single and not (isinstance(prompts, Sequence) and all(isinstance(text, str) for text in prompts)):
            raise DataError(f"Run.generate takes a prompt (a string) or a list of them, not {type(prompts).__name__} "
                            f"{reprlib.repr(prompts)}: e.g. run.generate(\"ROMEO:\")")
        listed = [prompts] if single else list(prompts)
        generate.check_options(tokens, temperature, top_k, seed, listed, chat, system, beams, length_penalty)
        generate.check_run(self._located(), beams)
        texts = generate.generate_restored(self._located(), *self._restore(backend, model_only=True), listed, tokens,
                                           temperature, top_k, seed, chat=chat, system=system, beams=beams,
                                           length_penalty=length_penalty).texts
        return texts[0] if single else texts

    def export(self, format: str, out: str | Path | None = None, merge: bool = False) -> Path:
        """The checkpoint as an HF folder ("hf"; `merge`: a LoRA run's adapters folded in), PEFT adapters ("peft"),
        a TF SavedModel ("saved_model") or a torch.export program ("torch_export"); returns the folder."""
        from tpuplex.commands.export import export

        return export(self._target, format, None if out is None else Path(out), merge=merge)

    def _located(self) -> run_folder.Found:
        """The checkpoint and config, found and verified once."""
        if self._found is None:
            self._found = run_folder.locate(self._target)
        return self._found

    def _restore(self, backend: str | None, model_only: bool = False) -> tuple[Any, Any]:
        """(experiment, state): the checkpoint restored on `backend` (default: the run's), kept for this Run's next
        call there, so an evaluation and then predictions build the model once. `model_only` (generation): without
        its data where the task can; a restore with the data serves it too."""
        name = backend or self._backend()
        for key in ((name, False), (name, True)) if model_only else ((name, False),):
            if key in self._restored:
                return self._restored[key]
        self._restored[(name, model_only)] = workflow.restore(self._located(), name, model_only)
        return self._restored[(name, model_only)]

    def _backend(self) -> str:
        """The backend the run trained on (its log's start record)."""
        return run_folder.trained_backend(self.folder)

