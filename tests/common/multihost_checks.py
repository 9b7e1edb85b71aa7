"""Multi-process runs on localhost, shared by the backend sessions: `tpuplex launch` against one process with the
same total device count, on real MRPC (../shared/glue) with a tiny random BERT that reads MRPC through MiniLM's
tokenizer (so the words are real tokens, and a step takes milliseconds).

Each check runs `python -m tpuplex` in child processes, as a user would, and reads what the run wrote.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from tiny_glue import write_tiny_model_reading

from tpuplex.commands import launch
from tpuplex.engine.preemption import PREEMPTED_EXIT
from tpuplex.hosts import HOST_LOST_EXIT

STEPS, CHECKPOINT_EVERY, EVAL_EVERY = 48, 8, 24
CHECKPOINT_STEPS = list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))
DEV_EXAMPLES = 408
# Variables a launcher sets (a test's own environment must not make the one-process run join another run), and
# XLA_FLAGS, where the jax session forces 8 CPU devices per process.
LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
              "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TF_CONFIG", "XLA_FLAGS")


def write_setup(folder: Path, minilm_dir: Path, mrpc: Path, **runtime) -> Path:
    """A tiny BERT with MiniLM's tokenizer and `<folder>/config.toml` training it for STEPS steps on `mrpc`."""
    model = write_tiny_model_reading(folder / "model", minilm_dir)
    runtime = {"checkpoint_every": CHECKPOINT_EVERY, "eval_every": EVAL_EVERY, "log_every": 1,
               "keep_checkpoints": 10, "host_timeout": 60, **runtime}
    sections = {
        "model": {"checkpoint": str(model)},
        "data": {"dataset": "mrpc", "data_dir": str(mrpc), "max_length": 64, "buckets": [32, 64],
                 "cache_dir": str(folder / "cache")},
        "train": {"learning_rate": 1e-3, "max_steps": STEPS, "global_batch": 16, "eval_batch": 16,
                  "warmup_ratio": 0.1, "seed": 3},
        "runtime": runtime,
    }
    text = "".join(f"[{section}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())
                   for section, values in sections.items())
    (folder / "config.toml").write_text(text)
    return folder / "config.toml"


def tpuplex(args: list[str], launched_as: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """`python -m tpuplex ARGS`, with `launched_as`: the variables a launcher gives one process (none by default)."""
    env = {key: value for key, value in os.environ.items() if key not in LAUNCH_ENV}
    return subprocess.Popen([sys.executable, "-m", "tpuplex", *args],
                            env={**env, "TF_CPP_MIN_LOG_LEVEL": "2", **(launched_as or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def train_args(config: Path, backend: str, output_dir: Path, *sets: str) -> list[str]:
    return ["train", str(config), "--backend", backend, "--set", f"runtime.output_dir={json.dumps(str(output_dir))}",
            *(part for item in sets for part in ("--set", item))]


def one_process(config: Path, backend: str, output_dir: Path, devices: int, *sets: str) -> dict:
    """A run in one process with `devices` CPU devices (0: the backend's default); returns its results.json."""
    extra = (f"runtime.cpu_devices={devices}",) if devices else ()
    status, output = finish(tpuplex(train_args(config, backend, output_dir, *extra, *sets)))
    assert status == 0, output
    return json.loads((output_dir / "results.json").read_text())


def launch_args(processes: int, devices: int, config: Path, backend: str, output_dir: Path, *sets: str) -> list[str]:
    return ["launch", "--processes", str(processes), "--cpu-devices", str(devices), "--",
            *train_args(config, backend, output_dir, *sets)]


def launched(processes: int, devices: int, config: Path, backend: str, output_dir: Path, *sets: str) -> dict:
    status, output = finish(tpuplex(launch_args(processes, devices, config, backend, output_dir, *sets)))
    assert status == 0, output
    return json.loads((output_dir / "results.json").read_text())


def train_losses(output_dir: Path) -> np.ndarray:
    entries = [json.loads(line) for line in (output_dir / "log.jsonl").read_text().splitlines()]
    return np.array([entry["loss"] for entry in entries if entry["event"] == "train"])


def final_params(output_dir: Path) -> dict[str, np.ndarray]:
    return load_file(output_dir / "checkpoints" / f"step-{STEPS:08d}" / "model.safetensors")


def final_moments(output_dir: Path) -> dict[str, np.ndarray]:
    """The optimizer's state of the last checkpoint (Adam's moments, by parameter name)."""
    return load_file(output_dir / "checkpoints" / f"step-{STEPS:08d}" / "optimizer.safetensors")


def check_same_run(single: Path, multi: Path, single_results: dict, multi_results: dict) -> None:
    """The must-show of a multi-process run: the one-process run's losses (1e-5 relative), final parameters
    (1e-5), dev metrics, with every dev example counted once per evaluation and one writer of every output."""
    expected, got = train_losses(single), train_losses(multi)
    assert len(expected) == len(got) == STEPS
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    want, have = final_params(single), final_params(multi)
    assert want.keys() == have.keys()
    for name in want:
        np.testing.assert_allclose(have[name], want[name], atol=1e-5, rtol=0, err_msg=name)
    for split, metrics in single_results["metrics"].items():
        for metric, value in metrics.items():
            assert abs(multi_results["metrics"][split][metric] - value) <= 1e-5, (split, metric)
    evaluations = STEPS // EVAL_EVERY
    assert multi_results["eval"]["examples"] == single_results["eval"]["examples"] == DEV_EXAMPLES * evaluations
    check_written_once(multi)
    check_reads_split(single_results["train_reads"], multi_results["train_reads"])


def check_reads_split(single: list[dict], multi: list[dict]) -> None:
    """Each process read about its share of the prepared training records (one shard file, fewer files than
    processes): together at least what one process read, each within a batch of an even share."""
    [whole] = single
    assert [entry["process"] for entry in multi] == list(range(len(multi)))
    assert sum(entry["records"] for entry in multi) >= whole["records"] > 0
    for entry in multi:
        assert abs(entry["records"] - whole["records"] / len(multi)) <= 16, (entry, whole)
        assert entry["bytes"] == entry["records"] * whole["bytes"] // whole["records"]


def check_written_once(output_dir: Path) -> None:
    """One directory per checkpoint step, nothing half-written beside them, one log of one run."""
    assert sorted(p.name for p in (output_dir / "checkpoints").iterdir()) == [
        f"step-{step:08d}" for step in CHECKPOINT_STEPS]
    events = [json.loads(line)["event"] for line in (output_dir / "log.jsonl").read_text().splitlines()]
    assert events.count("checkpoint") == len(CHECKPOINT_STEPS)
    assert events.count("eval") == STEPS // EVAL_EVERY


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    """Until `path` exists, polled every 5 ms (a run has 40 steps left after its first checkpoint: the poll sees it
    long before the run ends); fails if the run ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, finish(process)[1]
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.005)


def children(pid: int) -> dict[int, int]:
    """The child processes of the launcher `pid` by their process index (the RANK it gave each; Linux /proc)."""
    found = {}
    for thread in Path(f"/proc/{pid}/task").iterdir():
        for child in (thread / "children").read_text().split():
            variables = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            rank = next(v for v in variables if v.startswith(b"RANK=")).split(b"=", 1)[1]
            found[int(rank)] = int(child)
    return found


def check_preempt_one_then_kill_all_and_resume(config: Path, backend: str, folder: Path, devices: int,
                                               uninterrupted: Path, *sets: str) -> None:
    """One interrupted run, two interruptions: SIGTERM to process 1 alone once the first checkpoint exists stops
    both after the same step with its checkpoint (exit 75); started again, it resumes from there and every process
    is SIGKILLed once a later checkpoint exists; started a third time, it resumes from that checkpoint and ends
    with the uninterrupted run's parameters and optimizer moments, bit for bit."""
    output_dir = folder / "interrupted"
    run = tpuplex(launch_args(2, devices, config, backend, output_dir, *sets))
    wait_for(output_dir / "checkpoints" / f"step-{CHECKPOINT_EVERY:08d}", run)
    os.kill(children(run.pid)[1], signal.SIGTERM)
    status, output = finish(run)
    assert status == PREEMPTED_EXIT, output
    stops = re.findall(r"stopped by (SIGTERM|a signal to another process) after step (\d+)", output)
    assert sorted(kind for kind, _ in stops) == ["SIGTERM", "a signal to another process"], output
    step = int(stops[0][1])
    assert {int(at) for _, at in stops} == {step} and step < STEPS, output

    run = tpuplex(launch_args(2, devices, config, backend, output_dir, *sets), start_new_session=True)
    later = next(at for at in CHECKPOINT_STEPS if at > step)
    wait_for(output_dir / "checkpoints" / f"step-{later:08d}", run)
    os.killpg(run.pid, signal.SIGSTOP)  # at once: the kill below must land mid-run
    os.killpg(run.pid, signal.SIGKILL)
    output = "".join(run.communicate())
    assert f"resuming from {output_dir / 'checkpoints' / f'step-{step:08d}'}" in output, output
    written = sorted(p.name for p in (output_dir / "checkpoints").iterdir() if not p.name.startswith("."))
    assert written[-1] != f"step-{STEPS:08d}", "the run ended before it was killed"
    resume_and_compare(config, backend, output_dir, devices, uninterrupted, written[-1], *sets)


def resume_and_compare(config: Path, backend: str, output_dir: Path, devices: int, uninterrupted: Path,
                       checkpoint: str, *sets: str) -> None:
    """Run the interrupted 2-process run again: it resumes from `checkpoint` and ends with the uninterrupted
    run's parameters and optimizer moments, bit for bit."""
    status, output = finish(tpuplex(launch_args(2, devices, config, backend, output_dir, *sets)))
    assert status == 0, output
    assert f"resuming from {output_dir / 'checkpoints' / checkpoint}" in output
    for final in (final_params, final_moments):
        want, have = final(uninterrupted), final(output_dir)
        assert want.keys() == have.keys() and want, final.__name__
        for name in want:
            np.testing.assert_array_equal(have[name], want[name], err_msg=f"{final.__name__}: {name}")


def check_lost_process(config: Path, backend: str, folder: Path, devices: int, timeout: float,
                       *sets: str) -> float:
    """SIGKILL process 1 after the first checkpoint: process 0 exits with HOST_LOST_EXIT and one line saying so,
    rather than hanging (a generous deadline of `timeout`, runtime.host_timeout, plus 300 s: a loaded machine is
    slow, not wrong). Start-up is not bound by `timeout` (runtime.start_timeout keeps its default), so slow
    starts on a loaded machine are not taken for the loss. Returns the seconds it took."""
    output_dir = folder / "lost"
    run = tpuplex(launch_args(2, devices, config, backend, output_dir, f"runtime.host_timeout={timeout}", *sets))
    wait_for(output_dir / "checkpoints" / f"step-{CHECKPOINT_EVERY:08d}", run)
    os.kill(children(run.pid)[1], signal.SIGKILL)
    killed = time.monotonic()
    status, output = finish(run, timeout=timeout + 300)
    seconds = time.monotonic() - killed
    assert status == HOST_LOST_EXIT, output
    assert "tpuplex: error: process 0 of 2 stopped during" in output, output
    return seconds


def start_by_hand(config: Path, backend: str, output_dir: Path, processes: list[int], count: int,
                  sets: dict[int, tuple[str, ...]]) -> list[subprocess.Popen]:
    """Processes `processes` of a `count`-process run, started without the launcher, each with its own --set's."""
    envs = launch.environments(count, launch.free_ports(count + 2))
    return [tpuplex(train_args(config, backend, output_dir, *sets.get(index, ())), launched_as=envs[index])
            for index in processes]


def check_processes_must_agree(config: Path, backend: str, folder: Path, *sets: str) -> None:
    """Two processes started with different learning rates: both stop before the first step with one line, exit 2,
    and write nothing."""
    output_dir = folder / "disagree"
    runs = start_by_hand(config, backend, output_dir, [0, 1], 2,
                         {0: sets, 1: (*sets, "train.learning_rate=0.5")})
    for index, run in enumerate(runs):
        status, output = finish(run, timeout=300)
        assert status == 2, output
        assert "tpuplex: error: the processes of this run disagree on the configuration" in output, output
        assert "differs from process 0" in output and f"this one, process {index}" in output
    assert not output_dir.exists()


def check_missing_process(config: Path, backend: str, folder: Path, timeout: float, *sets: str) -> float:
    """Process 0 of 2 alone: it stops with exit 69 and one line, rather than hanging (runtime.start_timeout =
    `timeout`; a deadline of `timeout` plus 300 s). Returns seconds."""
    started = time.monotonic()
    (run,) = start_by_hand(config, backend, folder / "missing", [0], 2,
                           {0: (*sets, f"runtime.host_timeout={timeout}", f"runtime.start_timeout={timeout}")})
    status, output = finish(run, timeout=timeout + 300)
    seconds = time.monotonic() - started
    assert status == HOST_LOST_EXIT, output
    assert "tpuplex: error: " in output and "another process has died or never arrived" in output, output
    assert not (folder / "missing").exists()
    return seconds


class MultiProcessSuite:
    """The multi-process must-shows as tests; a backend's test module subclasses it as `Test...` and sets:

    backend: the backend's name. devices: CPU devices per process (0: the backend's default, one).
    single_devices: CPU devices of the one-process reference (the same total where the backend can).
    sets: --set options of every run. lost_timeout: runtime.host_timeout of the lost-process run.
    """

    backend: str
    devices: int = 0
    single_devices: int = 0
    sets: tuple[str, ...] = ()
    lost_timeout: float = 20

    @pytest.fixture(scope="class")
    @classmethod
    def runs(cls, tmp_path_factory, minilm_dir, shared_glue) -> tuple[Path, Path, dict, dict]:
        """(folder, config, one-process results, two-process results) of the uninterrupted runs."""
        folder = tmp_path_factory.mktemp("multihost")
        config = write_setup(folder, minilm_dir, shared_glue / "MRPC")
        single = one_process(config, cls.backend, folder / "one", cls.single_devices, *cls.sets)
        multi = launched(2, cls.devices, config, cls.backend, folder / "two", *cls.sets)
        return folder, config, single, multi

    def test_two_processes_train_like_one(self, runs) -> None:
        folder, _, single, multi = runs
        check_same_run(folder / "one", folder / "two", single, multi)
        assert multi["topology"].startswith(f"cpu x{2 * max(1, self.devices)} (process 0 of 2)")
        assert single["topology"].startswith(f"cpu x{max(1, self.single_devices)} (1 process)")

    def test_preempted_then_killed_processes_resume_to_the_same_state(self, runs) -> None:
        folder, config, _, _ = runs
        check_preempt_one_then_kill_all_and_resume(config, self.backend, folder, self.devices, folder / "two",
                                                   *self.sets)

    def test_a_lost_process_stops_the_other(self, runs) -> None:
        folder, config, _, _ = runs
        seconds = check_lost_process(config, self.backend, folder, self.devices, self.lost_timeout, *self.sets)
        print(f"{self.backend}: process 0 stopped {seconds:.1f} s after process 1 was killed")
