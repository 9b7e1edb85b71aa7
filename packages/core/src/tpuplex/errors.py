"""The exceptions users see: each message names the problem and the fix, on one line.

    TpuplexError        any bad input (the CLI prints its message and exits with 2; the API raises it)
      ConfigError       a config's sections, fields and values (and the names they give: backend, task, plugin)
        MeshError       a device layout (runtime.mesh, runtime.cpu_devices) that does not fit the devices or backend
      DataError         reading the data a config names: missing, unreadable or malformed files and rows
      CheckpointError   reading a checkpoint or pretrained weights: missing, damaged, or of another run

A caller that only reports catches TpuplexError; one that would act differently (fix a field, fetch the data again,
pick another checkpoint) catches the subclass.
"""

from pathlib import Path


class TpuplexError(Exception):
    """A user-facing error. The CLI prints its message on one line and exits with 2, without a traceback; the
    Python API (`tpuplex.train`, `tpuplex.Run`) raises it.

    Messages name what is wrong (the field, file or value) and what to do instead.
    """


class ConfigError(TpuplexError):
    """A config that cannot run: an unknown section or field, a value of the wrong type or out of range, a
    combination of fields that contradict each other, an unknown backend, task or plugin."""


class MeshError(ConfigError):
    """A device layout the backend cannot give: `runtime.mesh` does not fit the devices there are, splits
    parameters on a backend that keeps them whole, or `runtime.cpu_devices` asks for CPU devices the backend does not
    split. A run's checkpoint reads on any layout, so evaluating it falls back to the devices there are
    (`tpuplex.commands.run.create_backend`). `problem`: what does not fit, without the fix (which is for a run)."""

    def __init__(self, message: str, problem: str = ""):
        super().__init__(message)
        self.problem = problem or message


class DataError(TpuplexError):
    """The run's data cannot be read as the config says: a missing file or folder, an unreadable or malformed file,
    a row without its fields, labels or tags the task does not know."""


class CheckpointError(TpuplexError):
    """A checkpoint or pretrained weights that cannot be used: missing, damaged (it fails verification), written by
    another run or config, or weights that do not fit the model."""


def absence(path: Path) -> str:
    """Why `path` is not the file or folder a message asked for, said as it is: "is a folder", "is a file", "is
    not a file or a folder" (a device, a pipe) or "does not exist"."""
    if path.is_dir():
        return "is a folder"
    if path.is_file():
        return "is a file"
    return "is not a file or a folder" if path.exists() else "does not exist"
