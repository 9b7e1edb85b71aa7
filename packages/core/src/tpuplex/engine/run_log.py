"""What a run tells the world: a JSONL log, TensorBoard scalars and a progress bar.

    <output_dir>/log.jsonl       one JSON object per line: {"event": "start" | "train" | "eval" | "checkpoint" |
                                 "epoch", ...}
    <output_dir>/tensorboard/    tensorboardX event files: each numeric field of a record, the numbers of the log
                                 (train/loss, train/learning_rate, train/examples_per_s, train/seconds, train/mfu,
                                 ...; eval/<split>/<metric>)

A "train" record covers `runtime.log_every` steps; its `examples` and `seconds` are theirs (the trainer's
`_LossLog`), so the rate of several windows is their summed examples over their summed seconds, never the mean of
their rates.

A resumed run appends to both. The progress bar (rich) shows steps, loss and examples/s in a terminal, and in a
Jupyter notebook with ipywidgets installed; elsewhere (a batch job's log file, a notebook without ipywidgets) each
`runtime.log_every` window is one plain line instead. In a multi-process run only
process 0 reports; the others hold a Reporter with `write=False`, which writes and prints nothing.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)


def _import_summary_writer() -> type:
    """tensorboardX's SummaryWriter, imported without torch.

    tensorboardX imports torch at module level when it is installed (only to accept torch tensors), and the core
    must never import a framework; a `None` entry in sys.modules makes that `import torch` fail, which
    tensorboardX handles. When torch is already loaded (a torch backend in this process) nothing is masked.
    """
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


SummaryWriter = _import_summary_writer()

LOG_FILE = "log.jsonl"
TENSORBOARD_DIR = "tensorboard"


class Reporter:
    """Writes every record to the JSONL log and its numbers to TensorBoard; drives the progress bar, or, when
    stderr is not a terminal (a batch job's log file, nohup, a cluster's log), prints each "train" record as one
    plain line: `step 200/2000 (10%) loss 1.2345 (mean of 10 steps) lr 1.00e-03 512.3 ex/s 98.2 TFLOP/s MFU 9.9%
    eta 0:05:12`. Which loss is which is said: a line's (and `Run.history()`'s) is the mean over its log window, the
    live bar's ("last-step loss") the last step's alone.

    Use as a context manager so files are flushed and closed even when training stops with an error.
    """

    def __init__(self, output_dir: Path, console: Console | None = None, write: bool = True):
        self.output_dir = Path(output_dir)
        self.write = write
        self.console = console or Console(stderr=True)
        if write:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._log = (self.output_dir / LOG_FILE).open("a", encoding="utf-8")
            self._tensorboard = SummaryWriter(str(self.output_dir / TENSORBOARD_DIR))
        live = write and (self.console.is_terminal or (self.console.is_jupyter and _has_widgets()))
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("last-step loss {task.fields[loss]}"), TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
            console=self.console, disable=not live,
        )
        self._bar = None
        self._plain_progress = write and not live
        self._total = 0
        self._paced_from: tuple[int, float] | None = None  # (step, time) after the first step group
        self._last_logged = 0  # the step of the last "train" record: a record's window is the steps since

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def say(self, line: str) -> None:
        """Print one line for the user (above the progress bar while it runs)."""
        if self.write:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def record(self, event: str, step: int, **fields: Any) -> None:
        """Append `{"event", "step", "time", **fields}` to the log; numeric fields become TensorBoard scalars
        tagged `<event>/<field>` (eval records carry their split: `eval/<split>/<field>`)."""
        if not self.write:
            return
        entry = {"event": event, "step": step, "time": round(time.time(), 3), **fields}
        self._log.write(json.dumps(entry, default=_plain) + "\n")
        self._log.flush()
        prefix = f"{event}/{fields['split']}" if "split" in fields else event
        for name, value in fields.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self._tensorboard.add_scalar(f"{prefix}/{name}", value, step)
        self._tensorboard.flush()
        if event == "train" and self._plain_progress:
            self.say(self._progress_line(step, fields))

    def start_progress(self, total_steps: int, done: int) -> None:
        self._total, self._paced_from = total_steps, None
        self._last_logged = done
        self._bar = self._progress.add_task("train", total=total_steps, completed=done, loss="-", rate="-")
        self._progress.start()

    def _progress_line(self, step: int, fields: dict[str, Any]) -> str:
        """The progress bar's figures as one line: step, share done, the window's mean loss (said so when the
        window holds more than one step), learning rate and examples/s, and the time left at the pace of the steps
        after the first group (none before: that group's time is mostly compilation)."""
        window, self._last_logged = step - self._last_logged, step
        line = f"step {step}/{self._total} ({100 * step // max(self._total, 1)}%) loss {fields['loss']:.4f}"
        if window > 1:
            line += f" (mean of {window} steps)"
        if "learning_rate" in fields:
            line += f" lr {fields['learning_rate']:.2e}"
        line += f" {fields.get('examples_per_s', 0.0):.1f} ex/s"
        if fields.get("model_tflops_per_s") is not None:
            line += f" {fields['model_tflops_per_s']:.3g} TFLOP/s"
        if fields.get("mfu") is not None:  # None also above the peak (`tpuplex.flops.rates`)
            line += f" MFU {100 * fields['mfu']:.1f}%"
        if self._paced_from is not None and step > self._paced_from[0]:
            first, since = self._paced_from
            left = (time.perf_counter() - since) / (step - first) * (self._total - step)
            line += f" eta {datetime.timedelta(seconds=round(left))}"
        return line

    def advance(self, step: int, loss: float, examples_per_s: float, mfu: float | None = None) -> None:
        """Steps up to `step` are done. The first call after `start_progress` ends the first step group, whose time is
        mostly compilation: the time left is paced by the steps after it."""
        if self._paced_from is None:
            self._paced_from = (step, time.perf_counter())
        if self._bar is not None:
            rate = f"{examples_per_s:.1f} ex/s" + (f" MFU {100 * mfu:.1f}%" if mfu is not None else "")
            self._progress.update(self._bar, completed=step, loss=f"{loss:.4f}", rate=rate)

    def close(self) -> None:
        self._progress.stop()
        if self.write:
            self._tensorboard.close()
            self._log.close()


def _has_widgets() -> bool:
    """Whether a notebook can show the live bar: rich draws it in an ipywidgets output area."""
    import importlib.util

    return importlib.util.find_spec("ipywidgets") is not None


def headline(metrics: dict[str, float]) -> str:
    """The metrics as one console line: the headline ones only (`name value`); per-class details such as
    `person/f1` stay in results.json and log.jsonl."""
    return ", ".join(f"{name} {value:.4f}" for name, value in metrics.items() if "/" not in name)


def _plain(value: Any) -> Any:
    """numpy scalars and paths in log records, as JSON numbers and strings."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)
