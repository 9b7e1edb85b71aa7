"""Rotary position embeddings as transformers 5 computes them (`transformers.modeling_rope_utils`), framework-free:
how a decoder's config.json names its table (`read`), and each rope type's inverse frequencies and attention
factor (`Rope`), which the forward pass written once (`tpuplex.models.decoder.rotary`) takes as constants.

    type       inverse frequencies (float32 [rotated / 2])                  attention factor (cos, sin scaled by it)
    default    1 / theta ** (2i / rotated)                                   1
    linear     default / factor                                              1
    llama3     default, the long wavelengths / factor, the middle ones       1
               blended (low_freq_factor, high_freq_factor)
    yarn       interpolation / factor blended with extrapolation by a        attention_factor, or
               ramp over beta_fast..beta_slow rotations                      0.1 mscale ln(factor) + 1 (mscale_all_dim)
    longrope   default / short_factor, or / long_factor once the forward's   attention_factor, or
               length passes original_max_position_embeddings              sqrt(1 + ln(factor) / ln(original))
    dynamic    default with theta grown to theta (factor L / max - factor   1
               + 1) ** (rotated / (rotated - 2)) once the forward's length
               L passes max_position_embeddings

A forward's length is transformers' `max(position_ids) + 1`: a training or evaluation batch's bucket length, known
when it compiles; a decoding step's, the longest row so far. Only `longrope` and `dynamic` depend on it, and they
read it from the positions inside the compiled program (`Rope.inverse_frequencies`), so each decoding step rotates
its new keys as transformers' step does: the keys already in the cache keep the rotation they were written with,
as in transformers' cache (except Phi-3's `generate`, which drops its cache and recomputes the whole sequence with
the long factors at the step that crosses `original_max_position_embeddings`; tpuplex keeps its cache).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tpuplex.errors import TpuplexError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
"""The rope types tpuplex computes: every one transformers' Llama-shaped families take."""

REQUIRED = {"default": (), "linear": ("factor",), "dynamic": ("factor",),
            "yarn": ("factor", "original_max_position_embeddings"),
            "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
            "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")}
"""The keys each rope type's table must have (transformers' `_validate_<type>_rope_parameters` raise without them)."""

DEFAULT_THETA = 10_000.0
"""transformers' `RotaryEmbeddingConfigMixin.default_theta`, which every family of ours keeps."""


@dataclasses.dataclass(frozen=True)
class Rope:
    """One decoder's rotary table, as transformers' `ROPE_INIT_FUNCTIONS[kind]` computes it.

    rotated: the leading dimensions of each head that rotate (head_dim * partial_rotary_factor, Phi-3 alone may
        rotate fewer); the rest pass through.
    max_positions: config.json's `max_position_embeddings` (dynamic's base length); original_max_positions:
        `original_max_position_embeddings` (llama3, yarn, longrope).
    short_factor, long_factor: longrope's per-frequency divisors.
    """

    kind: str
    theta: float
    rotated: int
    max_positions: int
    factor: float = 1.0
    original_max_positions: int = 0
    attention_factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    @property
    def context(self) -> int:
        """The longest sequence the table is meant for: max_position_embeddings, or the length the table scales its
        base length to where that is longer (dynamic: factor x max_position_embeddings; yarn: factor x
        original_max_position_embeddings, as Qwen2.5's long-context config leaves max_position_embeddings at
        32,768 and scales it by 4). transformers itself sets no limit."""
        if self.kind == "dynamic":
            return int(self.factor * self.max_positions)
        if self.kind == "yarn":
            return max(self.max_positions, int(self.factor * self.original_max_positions))
        return self.max_positions

    @property
    def exponents(self) -> np.ndarray:
        """float32 [rotated / 2]: 2i / rotated, as torch computes `arange(0, dim, 2).float() / dim`."""
        return np.arange(0, self.rotated, 2, dtype=np.float32) / np.float32(self.rotated)

    def base_frequencies(self) -> np.ndarray:
        """float32 [rotated / 2]: the default rope's 1 / theta ** (2i / rotated)."""
        return np.float32(1.0) / np.float32(self.theta) ** self.exponents

    def frequencies(self, long: bool = False) -> np.ndarray:
        """float32 [rotated / 2]: the inverse frequencies of every type but dynamic past its length (its table for
        lengths up to max_position_embeddings); longrope's short ones, or its long ones (`long`). Computed once:
        every layer's forward asks for them."""
        return self._tables[long]

    @functools.cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray]:
        return self._frequencies(long=False), self._frequencies(long=True)

    def _frequencies(self, long: bool) -> np.ndarray:
        base = self.base_frequencies()
        if self.kind == "linear":
            return base / np.float32(self.factor)
        if self.kind == "longrope":
            factors = np.asarray(self.long_factor if long else self.short_factor, np.float32)
            return np.float32(1.0) / (factors * np.float32(self.theta) ** self.exponents)
        if self.kind == "llama3":
            return self._llama3(base)
        if self.kind == "yarn":
            return self._yarn()
        return base

    def _llama3(self, base: np.ndarray) -> np.ndarray:
        factor, original = np.float32(self.factor), self.original_max_positions
        low_wavelength, high_wavelength = original / self.low_freq_factor, original / self.high_freq_factor
        wavelength = np.float32(2 * math.pi) / base
        scaled = np.where(wavelength > low_wavelength, base / factor, base)
        smooth = ((np.float32(original) / wavelength - np.float32(self.low_freq_factor))
                  / np.float32(self.high_freq_factor - self.low_freq_factor))
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        middle = ~(wavelength < high_wavelength) & ~(wavelength > low_wavelength)
        return np.where(middle, smoothed, scaled).astype(np.float32)

    def _yarn(self) -> np.ndarray:
        dim, original = self.rotated, self.original_max_positions

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
        extrapolated = 1 - ramp
        powers = np.float32(self.theta) ** self.exponents
        interpolation, extrapolation = np.float32(1.0) / (np.float32(self.factor) * powers), np.float32(1.0) / powers
        return (interpolation * (1 - extrapolated) + extrapolation * extrapolated).astype(np.float32)

    def inverse_frequencies(self, ops: Any, positions: Any) -> Any:
        """float32 [rotated / 2] for a forward at `positions` int [B or 1, T] (`tpuplex.models.ops.Ops`): a
        constant, but for longrope (short or long by the forward's length) and dynamic (its base grown with it),
        which read that length, max(positions) + 1, inside the compiled program."""
        if self.kind == "longrope":
            long = ops.float32(ops.max(positions, (0, 1)) + 1 > self.original_max_positions)
            return ops.constant(self.frequencies(long=True)) * long + ops.constant(self.frequencies()) * (1 - long)
        if self.kind == "dynamic":
            length = ops.float32(ops.max(positions, (0, 1)) + 1)
            limit = ops.constant(np.float32(self.max_positions))
            length = ops.where(length > limit, length, limit)
            theta = self.theta * (self.factor * length / self.max_positions - (self.factor - 1)) ** (
                self.rotated / (self.rotated - 2))
            return 1.0 / theta ** ops.constant(self.exponents)
        return ops.constant(self.frequencies())


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def read(config: Any, head_dim: int, max_positions: int, *, phi3: bool = False) -> Rope:
    """The decoder's `Rope` from its config.json (`tpuplex.models.config_reader.ConfigReader`), read as transformers 5's
    config classes read it (`RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`, Phi-3's own): the legacy
    `rope_scaling` table, when it is set, replaces `rope_parameters` whole (and its `rope_theta`, if it has none,
    comes from the top-level `rope_theta` or 10,000, never from `rope_parameters`); `type` is the old name of
    `rope_type`; yarn, longrope and llama3 take `original_max_position_embeddings` from the table or
    `max_position_embeddings` (Phi-3: its top-level one, default 4096, over the table's, and "su" or "yarn" mean
    longrope). `partial_rotary_factor` below 1 is Phi-3's alone."""
    path = config.path
    table = config.config.get("rope_scaling") or config.config.get("rope_parameters") or {}
    if not isinstance(table, Mapping):
        raise TpuplexError(f"rope_parameters = {table!r} in {path} is not a table: fix the checkpoint's config.json")
    table = dict(table)
    if {"full_attention", "sliding_attention"} & table.keys():
        raise TpuplexError(f"rope_parameters in {path} gives a table per layer type, which the family does not "
                           "take: give one table")
    table.setdefault("rope_theta", config.get("rope_theta", float, DEFAULT_THETA))
    partial = config.config.get("partial_rotary_factor", 1.0 if phi3 else None)
    if partial is not None:
        table.setdefault("partial_rotary_factor", partial)
    kind = table.setdefault("rope_type", table.get("type", "default"))
    if kind in ("llama3", "yarn", "longrope"):
        if phi3:
            table["original_max_position_embeddings"] = config.get("original_max_position_embeddings", int, 4096)
        else:
            table.setdefault("original_max_position_embeddings", max_positions)
    if phi3:
        kind = "longrope" if kind in ("su", "yarn") else kind
        if kind not in ("default", "longrope"):
            raise TpuplexError(f"rope_type {kind!r} in {path} is not one Phi-3 takes: transformers builds Phi-3 "
                               "with 'default' or 'longrope'")
    if kind not in ROPE_TYPES:
        raise TpuplexError(f"rope_type {kind!r} in {path} is not supported: tpuplex computes "
                           f"{', '.join(ROPE_TYPES)}")
    missing = [key for key in REQUIRED[kind] if key not in table]
    if missing:
        raise TpuplexError(f"the {kind} rope table in {path} lacks {', '.join(missing)}: fix the checkpoint's "
                           "config.json")
    return _rope(table, kind, head_dim, max_positions, phi3, path)


def _number(table: Mapping[str, Any], key: str, path: Any, default: Any = None, positive: bool = True) -> Any:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or (
            positive and value <= 0):
        raise TpuplexError(f"{key} = {value!r} in the rope table of {path} must be a {'positive ' * positive}"
                           "number: fix the checkpoint's config.json")
    return value


def _rope(table: Mapping[str, Any], kind: str, head_dim: int, max_positions: int, phi3: bool, path: Any) -> Rope:
    theta = _number(table, "rope_theta", path)
    partial = _number(table, "partial_rotary_factor", path, 1.0)
    if partial != 1.0 and not (phi3 and partial < 1.0):
        raise TpuplexError(f"partial_rotary_factor = {partial} in {path} is not supported: transformers rotates "
                           "part of each head in Phi-3 alone (a factor below 1)")
    rotated = int(head_dim * partial)
    if rotated < 2 or rotated % 2:
        raise TpuplexError(f"{path}: rotary positions need an even rotated size, not {rotated} (head_dim "
                           f"{head_dim} x partial_rotary_factor {partial}): fix the checkpoint's config.json")
    rope = Rope(kind, float(theta), rotated, max_positions)
    original = _number(table, "original_max_position_embeddings", path) or 0
    factor = _number(table, "factor", path)
    if kind in ("linear", "dynamic", "llama3") and factor is None:
        raise TpuplexError(f"the {kind} rope table in {path} has factor = null: give the scaling factor")
    if kind == "dynamic" and rotated == 2:
        raise TpuplexError(f"{path}: dynamic rope needs more than 2 rotated dimensions")
    if kind in ("linear", "dynamic"):
        return dataclasses.replace(rope, factor=float(factor))
    if kind == "llama3":
        low, high = (_number(table, key, path) for key in ("low_freq_factor", "high_freq_factor"))
        if high <= low:
            raise TpuplexError(f"high_freq_factor {high} in {path} must be above low_freq_factor {low}")
        return dataclasses.replace(rope, factor=float(factor), original_max_positions=int(original),
                                   low_freq_factor=float(low), high_freq_factor=float(high))
    if kind == "yarn":
        factor = factor if factor is not None else max_positions / original
        attention = _number(table, "attention_factor", path, None, positive=False)
        if attention is None:
            mscale, all_dims = (_number(table, key, path) for key in ("mscale", "mscale_all_dim"))
            attention = (_mscale(factor, mscale) / _mscale(factor, all_dims) if mscale and all_dims
                         else _mscale(factor))
        return dataclasses.replace(
            rope, factor=float(factor), original_max_positions=int(original), attention_factor=float(attention),
            beta_fast=float(_number(table, "beta_fast", path) or 32), beta_slow=float(_number(table, "beta_slow",
                                                                                             path) or 1),
            truncate=bool(table.get("truncate", True)))
    if kind == "longrope":
        factors = {}
        for key in ("short_factor", "long_factor"):
            values = table[key]
            if (not isinstance(values, list) or len(values) != rotated // 2
                    or not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values)):
                raise TpuplexError(f"{key} in the rope table of {path} must be {rotated // 2} positive numbers (one "
                                   "per rotated frequency): fix the checkpoint's config.json")
            factors[key] = tuple(float(v) for v in values)
        factor = factor if factor is not None else max_positions / original
        attention = _number(table, "attention_factor", path, None, positive=False)
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        return dataclasses.replace(rope, factor=float(factor), original_max_positions=int(original),
                                   attention_factor=float(attention), **factors)
    return rope
