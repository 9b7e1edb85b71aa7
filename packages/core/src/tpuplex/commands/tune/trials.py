"""The trials of one `tpuplex tune` process: it takes trials until the study has its N, then waits for those still
running; each trial an ordinary run (`tpuplex.commands.run.train`) whose evaluations report to the study and its
pruner."""

from __future__ import annotations

import os
import shutil
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from tpuplex.commands import run as run_lib
from tpuplex.commands.run_folder import RUN_FILE
from tpuplex.commands.tune import storage as storage_lib
from tpuplex.commands.tune import summary as summary_lib
from tpuplex.commands.tune.search import Search
from tpuplex.commands.tune.summary import REFUSED_ATTR, SURPLUS_ATTR, TRIAL_PREFIX, UNSTARTED_ATTR, Setup, Tuned
from tpuplex.config import Config
from tpuplex.engine.preemption import Preempted
from tpuplex.errors import ConfigError, TpuplexError


class _Surplus(Exception):
    """A trial numbered beyond the study's N: given back unrun."""


class _Refused(Exception):
    """Bad input found by a trial (a metric the task does not report): the command stops with it."""

    def __init__(self, error: TpuplexError):
        super().__init__(str(error))
        self.error = error


class Worker:
    """One `tpuplex tune` process: takes trials until the study has its N, then waits for those still running."""

    def __init__(self, optuna: Any, plan: Search, base: Config, backend: str, config_path: Path | None, root: Path,
                 url: str, external: bool):
        self.optuna, self.plan, self.base, self.backend = optuna, plan, base, backend
        self.config_path, self.root, self.url, self.external = config_path, root, url, external
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.current: Any = None
        self.said_waiting = False
        self.said: set[str] = set()
        """The runs' notes said once for all this worker's trials (`Trainer.said`: an MFU above the peak)."""
        self.setup: Setup | None = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=plan.max_retry,
                                                                          inherit_intermediate_values=True)

    def run(self) -> Tuned:
        """This worker's share of the study; returns what tune.json holds at its end."""
        optuna = self.optuna
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # this command says what happens, one line a trial
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if not self.external:  # SQLite's file goes into the tune folder, marked as tune's first
                    summary_lib.mark_folder(self.root)
                storage, shown_url = storage_lib.open_storage(optuna, self.url, self.plan, self.retry)
                study = storage_lib.open_study(optuna, storage, self.plan, shown_url, self.base, self.backend)
                self.setup = Setup(self.plan, self.base, self.backend, self.config_path, self.root, shown_url)
                summary_lib.mark_folder(self.root)
                summary_lib.write(study, self.setup)
                self._loop(study)
                tuned = summary_lib.write(study, self.setup, plots=self.plan.plots)
                self._stop_on_one_failure(study, every=True)
                return tuned
        finally:
            optuna.logging.set_verbosity(verbosity)

    # -- taking trials ----------------------------------------------------------------------------------------

    def _loop(self, study: Any) -> None:
        optuna = self.optuna
        while True:
            logical = summary_lib.logical_trials(study, self.plan.trials)
            finished = [t for t in logical if t.last.state.is_finished()]
            waiting = any(t.last.state == optuna.trial.TrialState.WAITING for t in logical)
            if len(finished) == self.plan.trials:
                return
            if len(logical) < self.plan.trials or waiting:
                self._one_trial(study)
                continue
            if not self.said_waiting:
                running = self.plan.trials - len(finished)
                print(f"tune: all {self.plan.trials} trials have started; waiting for the {running} still running "
                      f"(a lost one is taken again {self.plan.grace_period} s after its last heartbeat)", flush=True)
                self.said_waiting = True
            optuna.storages.fail_stale_trials(study)  # a lost worker's trial is queued again, taken above
            time.sleep(min(self.plan.heartbeat_interval, 5))

    def _one_trial(self, study: Any) -> None:
        self.current = None
        try:
            study.optimize(self._objective, n_trials=1, catch=(TpuplexError, _Surplus), callbacks=[self._finished])
        except _Refused as refused:
            if self.current is not None:  # the refused trial's folder goes: it is not one of the study's trials
                shutil.rmtree(self.root / f"{TRIAL_PREFIX}{self.current.number}", ignore_errors=True)
            raise refused.error from None
        except KeyboardInterrupt as stopped:
            if self.current is not None:
                frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == self.current.number)
                if frozen.state == self.optuna.trial.TrialState.FAIL and not summary_lib.left_out(frozen):
                    self.retry(study, frozen)  # queued again: the next worker resumes it from its checkpoint
            if isinstance(stopped, Preempted):
                raise stopped.resumed_by("run the same tpuplex tune command again (or another worker takes it) to "
                                         "resume the trial from it") from None
            raise

    def _objective(self, trial: Any) -> float:
        self.current = trial
        trials = trial.study.get_trials(deepcopy=False)
        origin = summary_lib.origin(next(t for t in trials if t.number == trial.number))
        if origin == trial.number and summary_lib.rank(trials, trial.number) >= self.plan.trials:
            trial.set_user_attr(SURPLUS_ATTR, True)
            raise _Surplus(f"trial {trial.number} is beyond the study's {self.plan.trials}")
        params = {dim.field: dim.suggest(trial) for dim in self.plan.space}
        folder = self.root / f"{TRIAL_PREFIX}{origin}"
        trial.set_user_attr("folder", str(folder))
        trial.set_user_attr("worker", self.worker)
        config = self.base.override({**params, "runtime.output_dir": str(folder)})
        reports = _Reports(self.optuna, trial, self.plan)
        started = time.perf_counter()
        resumed = (folder / RUN_FILE).exists()
        try:
            results = run_lib.train(config, self.backend, self.config_path, on_evaluation=reports, said=self.said)
        except TpuplexError as error:  # the trial fails (a diverged loss, say); the search goes on
            trial.set_user_attr("error", " ".join(str(error).split()))
            if not resumed and not (folder / RUN_FILE).exists():
                trial.set_user_attr(UNSTARTED_ATTR, True)
            raise
        finally:
            trial.set_user_attr("steps", reports.step)
            trial.set_user_attr("seconds", round(time.perf_counter() - started, 3))
        value = reported_metric(results["metrics"], self.plan, trial)
        trial.set_user_attr("steps", results["step"])
        return value

    def _finished(self, study: Any, frozen: Any) -> None:
        """One line per finished trial, then tune.json and tune.md."""
        if summary_lib.left_out(frozen):
            return
        logical = summary_lib.logical_trials(study, self.plan.trials)
        best = summary_lib.best_trial(logical, self.plan)
        number = summary_lib.origin(frozen)
        state = frozen.state.name.lower()
        value = frozen.value if frozen.value is not None else summary_lib.last_value(frozen)
        shown = f"{self.plan.metric} {value:.6g}" if value is not None else "no value"
        failed = f" ({frozen.user_attrs.get('error', 'see the trial log')})" if state == "fail" else ""
        best_text = (f"best so far {best.last.value:.6g} (trial {best.number})" if best is not None
                     else "no complete trial yet")
        done = sum(t.last.state.is_finished() for t in logical)
        print(f"tune: trial {number} {state}{failed}: {shown} at step {frozen.user_attrs.get('steps', 0)}, "
              f"{summary_lib.params_text(frozen.params)}, {frozen.user_attrs.get('seconds', 0):.1f} s; {best_text} "
              f"[{done}/{self.plan.trials} done]", flush=True)
        summary_lib.write(study, self.setup)
        if state == "fail" and frozen.user_attrs.get(UNSTARTED_ATTR):
            self._stop_on_one_failure(study, every=False)

    def _stop_on_one_failure(self, study: Any, every: bool) -> None:
        """Stop with the error every trial so far failed on, when none completed or was pruned: bad input, not a
        search (a data folder that is not there, a model that does not build). `every`: at the end, all N trials
        failed on one error; else, as soon as two trials failed on one error before their run started."""
        logical = summary_lib.logical_trials(study, self.plan.trials)
        if not logical or any(t.last.state.name in ("COMPLETE", "PRUNED") for t in logical):
            return
        failed = [t for t in logical if t.last.state.name == "FAIL"
                  and (every or t.last.user_attrs.get(UNSTARTED_ATTR))]
        errors = {t.last.user_attrs.get("error") for t in failed}
        if len(errors) != 1 or None in errors or len(failed) < (self.plan.trials if every else 2):
            return
        numbers = ", ".join(str(t.number) for t in failed)
        raise TpuplexError(f"{errors.pop()} (trials {numbers} of study {self.plan.study!r} all failed on it and none "
                           "ran: fix it and run tpuplex tune again; those trials stay in the study as failed, so give "
                           "another --output or tune.study to start afresh)")


class _Reports:
    """`Trainer.on_evaluation` of one trial: the metric to the study after each evaluation, then the pruner's word
    (never at the last step: a trial that ran every step is complete)."""

    def __init__(self, optuna: Any, trial: Any, plan: Search):
        self.optuna, self.trial, self.plan = optuna, trial, plan
        self.step = 0

    def __call__(self, step: int, total_steps: int, metrics: dict[str, dict[str, float]]) -> None:
        value = reported_metric(metrics, self.plan, self.trial)
        self.step = step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a retried trial reports again a step its first attempt reported
            self.trial.report(value, step)
        if step < total_steps and self.trial.should_prune():
            raise self.optuna.TrialPruned(f"{self.plan.metric} {value:.6g} at step {step}")


def reported_metric(metrics: dict[str, dict[str, float]], plan: Search, trial: Any) -> float:
    """The searched metric of an evaluation; one the task does not report stops the command (bad input: a task
    whose `metric_names` could not say so before the first trial, or a per-type metric of a type the data lacks)."""
    value = metrics.get(plan.split, {}).get(plan.name)
    if value is None:
        reported = ", ".join(f"{split}.{name}" for split, names in metrics.items() for name in names)
        error = ConfigError(f"tune.metric = {plan.metric!r} is not reported by the task: its evaluations report "
                            f"{reported}")
        trial.set_user_attr(REFUSED_ATTR, str(error))
        raise _Refused(error)
    return float(value)

