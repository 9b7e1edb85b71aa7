"""LoRA adapters (Hu et al., 2021) on a decoder's projections, as PEFT defines them, framework-free.

An adapted projection computes

    y = base(x) + (alpha / rank) * B A dropout(x)        A [rank, in], B [out, rank]

with the base frozen. A starts as PEFT draws it (`kaiming_uniform_(a=sqrt(5))`: U(-1/sqrt(in), 1/sqrt(in))), here
from the core's generator so every backend starts from the same numbers, and B at zero, so step 0 is the base
model. The adapters are parameters like any other (`<HF module>.lora_A.weight`, `.lora_B.weight`, torch layout),
so the backends' steps, checkpoints and layouts take them as they are; the backends build them where
`Lora.modules` says, and train nothing else (`ModelSpec.frozen`).

`[model.lora]` (`Lora.read`): rank (8), alpha (8), dropout (0.0), targets (PEFT's defaults for the family,
`DecoderFamily.peft_targets`: Llama `["q_proj", "v_proj"]`, GPT-2 `["c_attn"]`). Targets match HF module names as
PEFT's `target_modules` do: a list of names, each matching a module called so or ending in `.name`, or one string, a
regular expression the whole module name must match.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from tpuplex import initializers
from tpuplex.errors import ConfigError
from tpuplex.models.decoder import PROJECTIONS, DecoderArch, DecoderFamily, canonical_shapes
from tpuplex.slices import BlockReader, Index, SliceReader, bounds

PEFT_PREFIX = "base_model.model."
"""What PEFT puts before a module's name in `adapter_model.safetensors`."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_FIELDS = {
    "rank": (lambda v: _number(v) and isinstance(v, int) and v > 0, "an integer greater than 0"),
    "alpha": (lambda v: _number(v) and 0 < v < float("inf"), "a finite number greater than 0"),
    "dropout": (lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "targets": (lambda v: isinstance(v, str) and bool(v) or isinstance(v, list) and bool(v)
                and all(isinstance(t, str) and t for t in v),
                'a list of module names, e.g. ["q_proj", "v_proj"], or a regular expression'),
}
"""[model.lora]'s fields: (accepts the value, what to use instead)."""


@dataclasses.dataclass(frozen=True)
class Lora:
    """The adapters of one run.

    modules: (canonical module, its HF module) of every adapted projection, in the model's order, e.g.
        ("block.3.query", "model.layers.3.self_attn.q_proj").
    in_out: the family's kernel layout keeps [in, out] (GPT-2's Conv1D: PEFT's `fan_in_fan_out`). The adapters
        themselves are [rank, in] and [out, rank] in every family and framework, never transposed.
    """

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...] | str
    modules: tuple[tuple[str, str], ...]
    in_out: bool = False

    def adapts(self, module: str) -> bool:
        """Whether the canonical projection `module` (`block.3.query`) has an adapter."""
        return any(module == canonical for canonical, _ in self.modules)

    def without_dropout(self) -> Lora:
        return dataclasses.replace(self, dropout=0.0)

    @property
    def scale(self) -> float:
        """alpha / rank, PEFT's `scaling` (no rsLoRA)."""
        return self.alpha / self.rank

    @classmethod
    def read(cls, table: Mapping[str, Any], family: DecoderFamily, arch: DecoderArch) -> Lora:
        """`[model.lora]` checked against the model: one TpuplexError naming the field and the fix."""
        for key, value in table.items():
            if key not in _FIELDS:
                raise ConfigError(f"unknown config field model.lora.{key}: [model.lora] has {', '.join(_FIELDS)}")
            allowed, hint = _FIELDS[key]
            if not allowed(value):
                raise ConfigError(f"model.lora.{key} = {value!r} is not allowed: use {hint}")
        targets = table.get("targets") or family.peft_targets
        if not targets:
            raise ConfigError(f"PEFT has no default target modules for {family.name}: name them in "
                              f"model.lora.targets, e.g. {sorted(_projection_names(family, arch))}")
        if isinstance(targets, str):
            try:
                re.compile(targets)
            except re.error as error:
                raise ConfigError(f"model.lora.targets = {targets!r} is not a regular expression ({error}): fix it, "
                                  "or give a list of module names, e.g. [\"q_proj\", \"v_proj\"]") from None
        targets = targets if isinstance(targets, str) else tuple(targets)
        projections = projection_modules(family, arch)
        modules = {canonical: hf for canonical, hf in projections.items() if _matches(targets, hf)}
        if not modules:
            raise ConfigError(f"model.lora.targets = {targets!r} matches none of the model's projections: use "
                              f"some of {', '.join(sorted(_projection_names(family, arch)))}")
        # B A has rank at most min(in, out) of the projection: a larger rank only adds memory (a rank of 10^9 asks
        # for terabytes), so it is refused before anything is allocated.
        rank = table.get("rank", 8)
        weights = canonical_shapes(arch)
        smallest, hf = min((min(weights[f"{canonical}.weight"]), hf) for canonical, hf in modules.items())
        if rank > smallest:
            raise ConfigError(f"model.lora.rank = {rank} is more than {smallest}, the smaller dimension of {hf}: an "
                              f"adapter's rank can be at most its projection's min(in, out); use a rank <= {smallest} "
                              "(8 is PEFT's default)")
        return cls(rank, float(table.get("alpha", 8.0)), float(table.get("dropout", 0.0)), targets,
                   tuple(modules.items()), arch.kernel_layout == "in_out")

    def canonical_shapes(self, arch: DecoderArch) -> dict[str, tuple[int, ...]]:
        """Canonical name (`block.3.query.lora_A.weight`) -> shape of every adapter matrix: A [rank, in],
        B [out, rank]."""
        weights = canonical_shapes(arch)
        shapes = {}
        for canonical, _ in self.modules:
            into, out = weights[f"{canonical}.weight"][:: 1 if self.in_out else -1]
            shapes[f"{canonical}.lora_A.weight"] = (self.rank, into)
            shapes[f"{canonical}.lora_B.weight"] = (out, self.rank)
        return shapes

    def hf_names(self) -> dict[str, str]:
        """Canonical name -> HF name (`model.layers.3.self_attn.q_proj.lora_A.weight`) of every adapter matrix."""
        return {f"{canonical}.{matrix}.weight": f"{hf}.{matrix}.weight"
                for canonical, hf in self.modules for matrix in ("lora_A", "lora_B")}

    def shapes(self, arch: DecoderArch) -> dict[str, tuple[int, ...]]:
        """HF name -> shape of every adapter matrix."""
        names = self.hf_names()
        return {names[canonical]: shape for canonical, shape in self.canonical_shapes(arch).items()}

    def initial(self, arch: DecoderArch, seed: int) -> dict[str, SliceReader]:
        """The adapters before training: A as PEFT draws it, U(+-1/sqrt(fan_in)) keyed by `seed` and its name
        (`tpuplex.initializers`), B zero."""
        params: dict[str, SliceReader] = {}
        for name, shape in self.shapes(arch).items():
            if ".lora_A." in name:
                params[name] = initializers.uniform(seed, name, shape, 1.0 / np.sqrt(shape[1]))
            else:
                params[name] = np.zeros(shape, np.float32)
        return params

    def merged(self, params: Mapping[str, SliceReader]) -> dict[str, SliceReader]:
        """The base with each adapter folded in (W += scale * B A, in the family's layout), adapters removed:
        the model `tpuplex export --format hf --merge` writes, each weight computed a block at a time when read."""
        merged = {name: array for name, array in params.items() if ".lora_" not in name}
        for _, hf in self.modules:
            merged[f"{hf}.weight"] = MergedWeight(merged[f"{hf}.weight"], params[f"{hf}.lora_A.weight"],
                                                  params[f"{hf}.lora_B.weight"], self.scale, self.in_out)
        return merged

    def peft_config(self, task_type: str, base: str) -> dict[str, Any]:
        """`adapter_config.json` as PEFT writes it for these adapters on `base` (the base model's name or path)."""
        return {"peft_type": "LORA", "task_type": task_type, "base_model_name_or_path": base, "r": self.rank,
                "lora_alpha": self.alpha, "lora_dropout": self.dropout,
                "target_modules": self.targets if isinstance(self.targets, str) else list(self.targets),
                "fan_in_fan_out": self.in_out, "bias": "none", "use_rslora": False, "use_dora": False,
                "init_lora_weights": True, "modules_to_save": None, "inference_mode": True}


@dataclasses.dataclass(frozen=True)
class MergedWeight(BlockReader):
    """`weight` with its adapter folded in: W + scale * B A ([out, in]; its transpose for an [in, out] `in_out`
    weight), read a block at a time (a `tpuplex.slices.SliceReader`): a block of rows and columns needs only
    those rows of B and columns of A. The product is taken in float64 and the sum rounded once to float32."""

    weight: SliceReader
    lora_a: SliceReader
    lora_b: SliceReader
    scale: float
    in_out: bool

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def __getitem__(self, index: Index) -> np.ndarray:
        (first, last), (low, high) = bounds(index, self.shape)
        outputs, inputs = ((low, high), (first, last)) if self.in_out else ((first, last), (low, high))
        delta = self.scale * (np.asarray(self.lora_b[slice(*outputs), :], np.float64)
                              @ np.asarray(self.lora_a[:, slice(*inputs)], np.float64))
        block = np.asarray(self.weight[slice(first, last), slice(low, high)], np.float64)
        return (block + (delta.T if self.in_out else delta)).astype(np.float32)


def projection_modules(family: DecoderFamily, arch: DecoderArch) -> dict[str, str]:
    """Canonical module -> HF module of every projection an adapter may sit on, in the model's order."""
    modules = {}
    for name in canonical_shapes(arch):
        module, leaf = name.rsplit(".", 1)
        if leaf == "weight" and module.startswith("block.") and module.rsplit(".", 1)[-1] in PROJECTIONS:
            modules[module] = family.hf_name(name).removesuffix(".weight")
    return modules


def _projection_names(family: DecoderFamily, arch: DecoderArch) -> set[str]:
    """The HF names (`q_proj`) of the projections an adapter may sit on."""
    return {hf.rsplit(".", 1)[-1] for hf in projection_modules(family, arch).values()}


def _matches(targets: tuple[str, ...] | str, module: str) -> bool:
    """PEFT's rule: a regular expression matches the whole name; a name in a list matches itself or a suffix."""
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return any(module == target or module.endswith(f".{target}") for target in targets)


def fingerprint(params: Mapping[str, Any]) -> str:
    """sha256 of parameters (names, dtypes, shapes and bytes, in name order): what a LoRA checkpoint records of
    the base it was trained on, so its adapters are never put on another base."""
    digest = hashlib.sha256()
    for name in sorted(params):
        array = np.ascontiguousarray(params[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()
