"""Devices as TensorFlow sees them, and the `tf.distribute` strategy that runs the steps on them.

    TPU (Colab, Kaggle, TPU VM)   TPUClusterResolver -> connect -> initialize_tpu_system -> TPUStrategy
    TF_CONFIG with several tasks  MultiWorkerMirroredStrategy (one process per host; each host's GPUs, or its CPU)
    several GPUs / CPU devices    MirroredStrategy (CPU: the host split into logical devices)
    otherwise                     OneDeviceStrategy

The core's `tpuplex.hardware.discover` decides the kind (honouring `runtime.device`); this module confirms it with
TensorFlow and reports the strategy, the replica count and whether the steps are XLA-compiled in `Topology.detail`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

import tensorflow as tf

from tpuplex.config import RuntimeConfig
from tpuplex.errors import MeshError, TpuplexError
from tpuplex.hardware import Topology, discover

JIT_ENV = "TPUPLEX_TF_JIT"


def split_host_cpu(count: int) -> list[tf.config.LogicalDevice]:
    """The first `count` logical CPU devices, splitting the host CPU into `count` when TF is not initialised yet.

    TensorFlow fixes its logical devices when it initialises (at the first op or device listing), so the split
    only takes effect before that; afterwards an existing split of at least `count` devices is reused.
    """
    try:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * count
        )
    except RuntimeError:
        pass  # already initialised: use the logical devices it has
    logical = tf.config.list_logical_devices("CPU")
    if len(logical) < count:
        raise MeshError(
            f"runtime.cpu_devices = {count}, but TensorFlow was initialised earlier in this process with "
            f"{len(logical)} CPU device(s): set runtime.cpu_devices before anything else uses TensorFlow, "
            f"or use at most {len(logical)}",
            f"runtime.cpu_devices = {count}, but TensorFlow already has {len(logical)} CPU device(s) in this process")
    return logical[:count]


def build_strategy(runtime: RuntimeConfig) -> tuple[tf.distribute.Strategy, Topology]:
    """The strategy for `runtime.device` / `runtime.cpu_devices`, and the Topology it gives."""
    found = discover(runtime.device)
    if found.kind == "tpu":
        strategy = _tpu_strategy(found)
        return strategy, dataclasses.replace(
            found, device_count=strategy.num_replicas_in_sync, detail="TPUStrategy",
            host_count=max(1, strategy.extended.num_hosts),
        )
    tasks = _tf_config_tasks()
    if len(tasks) > 1:
        return _multi_worker(runtime, found, tasks)
    if found.kind == "gpu":
        gpus = tf.config.list_logical_devices("GPU")
        if not gpus:
            raise TpuplexError(
                f"a GPU was found ({found.report()}) but TensorFlow sees none: install the GPU build "
                "(pip install './packages/tf_backend[gpu]') or set runtime.device = \"cpu\""
            )
        return _data_parallel([device.name for device in gpus], found, "gpu", found.source)
    requested = runtime.cpu_devices
    cpus = split_host_cpu(requested) if requested > 0 else tf.config.list_logical_devices("CPU")
    source = f"{len(cpus)} logical CPU devices" if len(cpus) > 1 else found.source
    return _data_parallel([device.name for device in cpus], found, "cpu", source)


def _data_parallel(names: list[str], found: Topology, kind: str, source: str) -> tuple[tf.distribute.Strategy,
                                                                                     Topology]:
    if len(names) > 1:
        strategy: tf.distribute.Strategy = _mirrored_strategy(names)
        detail = f"MirroredStrategy x{len(names)}"
    else:
        strategy = tf.distribute.OneDeviceStrategy(names[0])
        detail = "OneDeviceStrategy"
    return strategy, dataclasses.replace(found, kind=kind, device_count=len(names), source=source, detail=detail)


def _tf_config_tasks() -> list[tuple[str, int]]:
    """The (job, index) of every chief and worker task in TF_CONFIG, chief first ([] without TF_CONFIG)."""
    if not os.environ.get("TF_CONFIG"):
        return []
    try:
        cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
        return [(job, index) for job in ("chief", "worker") for index in range(len(cluster.get(job, [])))]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise TpuplexError("TF_CONFIG is not a JSON object with a \"cluster\" of \"worker\" addresses: fix it "
                           "(see docs/multihost.md), or unset it for a single-process run") from None


def _multi_worker(runtime: RuntimeConfig, found: Topology,
                  tasks: list[tuple[str, int]]) -> tuple[tf.distribute.Strategy, Topology]:
    """MultiWorkerMirroredStrategy over TF_CONFIG's tasks: each process its GPUs, or its one CPU device.

    `runtime.collective_timeout` bounds every collective, so a lost worker ends the others with an error."""
    if runtime.cpu_devices > 1:
        raise MeshError(f"runtime.cpu_devices = {runtime.cpu_devices}, but MultiWorkerMirroredStrategy gives "
                        "each worker one CPU device: set runtime.cpu_devices = 0 and start more processes",
                        f"runtime.cpu_devices = {runtime.cpu_devices} splits the CPU, which a worker of several "
                        "does not")
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=runtime.collective_timeout)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except (ValueError, RuntimeError) as error:
        raise TpuplexError(f"TF_CONFIG describes {len(tasks)} tasks but MultiWorkerMirroredStrategy could not start "
                           f"({str(error).splitlines()[0]}): start every task with the same TF_CONFIG cluster "
                           "and its own task index") from None
    resolver = strategy.cluster_resolver
    kind = "gpu" if found.kind == "gpu" else "cpu"
    replicas = strategy.num_replicas_in_sync
    return strategy, dataclasses.replace(
        found, kind=kind, device_count=replicas, host_count=len(tasks),
        process_index=tasks.index((resolver.task_type, resolver.task_id)), source="TF_CONFIG",
        detail=f"MultiWorkerMirroredStrategy x{replicas}")


_mirrored_strategies = itertools.count()


def _mirrored_strategy(names: list[str]) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy whose collectives cannot meet those of an earlier one in this process.

    Every MirroredStrategy numbers its collective groups from 1, so a second one over the same devices (the next
    run of a sweep, another test) reuses the first one's keys and aborts on a shape mismatch. TF's own tests
    separate strategies with `_collective_key_base`, the class attribute this subclass sets.
    """
    base = 10_000 * next(_mirrored_strategies)
    return type("MirroredStrategy", (tf.distribute.MirroredStrategy,), {"_collective_key_base": base})(names)


def _tpu_strategy(found: Topology) -> tf.distribute.TPUStrategy:
    # A TPU VM without TPU_NAME (found through /dev/accel*) is "local"; otherwise the resolver reads TPU_NAME or
    # COLAB_TPU_ADDR itself, as it does in Colab and Kaggle notebooks.
    tpu = "local" if found.source.startswith("/dev/") else None
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    # No metadata server, an unknown name, a Cloud TPU API or driver failure: all end the same way for the user.
    except Exception as error:  # noqa: BLE001
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TpuplexError(
            f"a TPU is announced ({found.source}) but TensorFlow could not initialise it ({reason}): "
            "check TPU_NAME and that the TPU is up and runs a matching TensorFlow (pip install "
            "'./packages/tf_backend[tpu]'), or set runtime.device = \"cpu\""
        ) from None


def use_xla(topology: Topology) -> bool:
    """Whether the per-replica programs get `jit_compile=True`; TPUPLEX_TF_JIT=1 or 0 overrides the default.

    Default: on TPUs (where XLA is the only way) and GPUs, off on CPUs. TensorFlow's own CPU kernels (oneDNN) ran
    MiniLM's [32, 128] step about 1.8x faster than XLA:CPU (benchmarks/throughput.py, TPUPLEX_TF_JIT=0 and 1 one
    after the other, while another job shared the machine). MirroredStrategy over logical CPU devices would also
    compile one copy of each program per device on the same cores (tiny BERT's first step: 262 s with XLA, 55 s
    without, on 8 logical CPUs). The losses agree to float32 rounding; dropout masks differ, since TensorFlow's
    stateless random ops draw other numbers under XLA.
    """
    override = os.environ.get(JIT_ENV, "")
    if override in ("0", "1"):
        return override == "1"
    return topology.kind != "cpu"
