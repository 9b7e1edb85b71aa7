"""T5's span corruption, the pre-training objective of Raffel et al. (2020), in numpy, vectorised over the batch.

A row of `tokens_length` tokens is split into alternating non-noise and noise spans (beginning with non-noise, as
many noise spans as non-noise spans); each noise span becomes one sentinel in the inputs, each non-noise span one
sentinel in the targets, and both end with EOS:

    tokens   We hold these truths to be self evident that
    inputs   We hold <extra_id_0> to be <extra_id_1> that </s>
    labels   <extra_id_0> these truths <extra_id_1> self evident </s>

The k-th span of a row (k = 0, 1, ...) gets `sentinel_ids[k]`: T5's tokenizers put <extra_id_0> at the top of the
vocabulary and count down, which is what T5 (`vocabulary.vocab_size - 1 - k`) and HF's `run_t5_mlm_flax.py`
(`len(tokenizer) - 1 - k`) write. Every row of a batch has the same number of noise tokens and spans (they depend
on the length only), so the outputs are static-shape arrays: inputs [B, inputs_length], labels [B, targets_length].

This is the algorithm of google-research/text-to-text-transfer-transformer t5/data/preprocessors.py
(`random_spans_helper`, `random_spans_noise_mask`, `noise_span_to_unique_sentinel`,
`nonnoise_span_to_unique_sentinel`) as HF's examples/flax/language-modeling/run_t5_mlm_flax.py ports it to numpy
(`compute_input_and_target_lengths`, `FlaxDataCollatorForT5MLM.random_spans_noise_mask`, `create_sentinel_ids`,
`filter_input_ids`). Its one random step, shuffling the segment boundaries of a row (`np.random.shuffle` there), is
here `shuffle` of the caller's `numpy.random.Generator`, called in the reference's order (row by row, the noise
boundaries, then the non-noise boundaries), so a batch is a function of the generator's state alone: callers pass
`np.random.default_rng([seed, step])`. Those shuffles are the only per-row Python step; the rest is whole-batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpuplex.errors import ConfigError

NOISE_DENSITY = 0.15
MEAN_SPAN_LENGTH = 3.0


def _check(noise_density: float, mean_span_length: float) -> None:
    if not 0.0 < noise_density < 1.0:
        raise ConfigError(f"noise_density = {noise_density} must be between 0 and 1 (exclusive): T5 uses 0.15")
    if not mean_span_length >= 1.0:
        raise ConfigError(f"mean_span_length = {mean_span_length} must be at least 1: T5 uses 3.0")


def span_counts(length: int, noise_density: float = NOISE_DENSITY,
                mean_span_length: float = MEAN_SPAN_LENGTH) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row of `length` tokens, as `random_spans_noise_mask` counts them.

    noise = round(length * noise_density), kept within [1, length - 1]; spans = round(noise / mean_span_length),
    kept within [1, non-noise] (T5's counts, with an upper bound: at densities above 0.5 T5 could ask for more
    non-noise spans than non-noise tokens; HF's example divides min(noise, non-noise) instead, which agrees at
    densities below 0.5). There are as many non-noise spans as noise spans. Rounding is Python's (half to even), as
    numpy's and TF's.
    """
    _check(noise_density, mean_span_length)
    if length < 2:
        raise ConfigError(f"a row of {length} token(s) cannot be span-corrupted: it needs at least 2 tokens")
    noise = min(max(round(length * noise_density), 1), length - 1)
    spans = min(max(round(noise / mean_span_length), 1), length - noise)
    return noise, spans


def corrupted_lengths(tokens_length: int, noise_density: float = NOISE_DENSITY,
                      mean_span_length: float = MEAN_SPAN_LENGTH) -> tuple[int, int]:
    """(inputs_length, targets_length) that `corrupt` makes of rows of `tokens_length` tokens: the non-noise tokens
    and one sentinel per noise span plus EOS, and the noise tokens and one sentinel per non-noise span plus EOS."""
    noise, spans = span_counts(tokens_length, noise_density, mean_span_length)
    return tokens_length - noise + spans + 1, noise + spans + 1


def input_and_target_lengths(inputs_length: int, noise_density: float = NOISE_DENSITY,
                             mean_span_length: float = MEAN_SPAN_LENGTH) -> tuple[int, int]:
    """(tokens_length, targets_length): the longest raw row whose corrupted inputs fit in `inputs_length` tokens
    (EOS included), and the length of its targets (EOS included). T5's `random_spans_helper`, HF's
    `compute_input_and_target_lengths`: cut the corpus into rows of tokens_length; `corrupt` then makes inputs
    [B, inputs_length] and labels [B, targets_length]. For T5's inputs_length 512 (density 0.15, spans of 3):
    (568, 114).

    The counts are `span_counts`'s, so the lengths always agree with what `corrupt` makes. They equal the
    reference's except where its own formula counts spans that its mask function does not make (zero noise spans,
    more non-noise spans than non-noise tokens, rows whose inputs do not fit); at T5's settings they are equal for
    every inputs_length >= 10.

    The inputs are one token shorter than inputs_length where no row length makes exactly inputs_length (some
    lengths at densities of 0.5 and above, whose inputs grow 2 tokens at a time) and, as the reference's, at density
    0.5 when the targets would be longer than the inputs (a row one token shorter is taken; its targets are counted
    again, where the reference subtracts 1, which is not always right): `corrupted_lengths(tokens_length)` gives
    the exact shapes.
    """
    _check(noise_density, mean_span_length)
    tokens_length = inputs_length  # the reference starts here; with spans of ~1 token, rows longer than 1 + noise
    while tokens_length >= 2 and corrupted_lengths(tokens_length, noise_density, mean_span_length)[0] > inputs_length:
        tokens_length -= 1  # ... are too long: a shorter row is taken (the reference's would not fit)
    if tokens_length < 2:
        raise ConfigError(f"inputs of {inputs_length} tokens are too short for span corruption with noise_density "
                          f"{noise_density} and mean_span_length {mean_span_length}: use longer inputs")
    while corrupted_lengths(tokens_length + 1, noise_density, mean_span_length)[0] <= inputs_length:
        tokens_length += 1
    made, targets_length = corrupted_lengths(tokens_length, noise_density, mean_span_length)
    if noise_density == 0.5 and targets_length > made:  # the reference's nudge to equal lengths
        tokens_length -= 1
        targets_length = corrupted_lengths(tokens_length, noise_density, mean_span_length)[1]
    return tokens_length, targets_length


def _segment_lengths(boundaries: np.ndarray, num_items: int) -> np.ndarray:
    """Segment lengths from boundaries: boundaries bool [B, num_items - 1], True after item j where a new segment
    begins at item j + 1, the same count per row (the reference's shuffled `arange(num_items - 1) <
    num_segments - 1`). Returns int64 [B, num_segments] of positive lengths summing to num_items."""
    batch = boundaries.shape[0]
    _, columns = np.nonzero(boundaries)  # row-major: num_segments - 1 per row, ascending
    starts = np.concatenate([np.zeros((batch, 1), np.int64), columns.reshape(batch, -1) + 1,
                             np.full((batch, 1), num_items, np.int64)], axis=1)
    return np.diff(starts, axis=1)


def noise_masks(batch: int, length: int, rng: np.random.Generator, noise_density: float = NOISE_DENSITY,
                mean_span_length: float = MEAN_SPAN_LENGTH) -> np.ndarray:
    """Random-span noise masks: bool [batch, length], True on noise tokens.

    Every row has `span_counts(length)` noise tokens in as many noise spans, alternating with non-noise spans and
    beginning with non-noise (so a row's first token is never noise and its last always is); subject to that, all
    masks are equally likely (`random_spans_noise_mask`). Calls `rng.shuffle` twice a row, as the reference calls
    `np.random.shuffle`: row i of a batch is the reference's i-th mask from the same generator.
    """
    noise, spans = span_counts(length, noise_density, mean_span_length)
    noise_boundaries = np.empty((batch, noise - 1), bool)
    noise_boundaries[:] = np.arange(noise - 1) < spans - 1
    nonnoise_boundaries = np.empty((batch, length - noise - 1), bool)
    nonnoise_boundaries[:] = np.arange(length - noise - 1) < spans - 1
    for row in range(batch):  # the reference's random step, in its order
        rng.shuffle(noise_boundaries[row])
        rng.shuffle(nonnoise_boundaries[row])
    noise_lengths = _segment_lengths(noise_boundaries, noise)
    nonnoise_lengths = _segment_lengths(nonnoise_boundaries, length - noise)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=2).reshape(batch, 2 * spans)
    span_starts = np.cumsum(interleaved, axis=1)[:, :-1]  # every span's start but the first's (0)
    indicator = np.zeros((batch, length), np.int32)
    np.put_along_axis(indicator, span_starts, 1, axis=1)
    return np.cumsum(indicator, axis=1) % 2 == 1  # odd spans are noise


def replace_spans(tokens: np.ndarray, mask: np.ndarray, sentinel_ids: np.ndarray, eos_id: int) -> np.ndarray:
    """Each run of True in a row of `mask` replaced by one sentinel (the k-th run by sentinel_ids[k]), EOS appended.

    tokens: int [B, L]; mask: bool [B, L] with the same number of True and of runs in every row (as `noise_masks`
    makes); sentinel_ids: int [S], S >= the runs of a row. Returns [B, L - masked + runs + 1] of tokens' dtype. With
    mask = the noise, these are T5's inputs (`noise_span_to_unique_sentinel`); with ~noise, its targets
    (`nonnoise_span_to_unique_sentinel`).
    """
    previous = np.zeros_like(mask)
    previous[:, 1:] = mask[:, :-1]
    starts = mask & ~previous
    run = np.cumsum(starts, axis=1) - 1  # at a run's start: its index in the row
    values = np.where(starts, sentinel_ids[np.maximum(run, 0)], tokens)
    kept = values[~mask | starts].reshape(tokens.shape[0], -1)
    return np.concatenate([kept, np.full((tokens.shape[0], 1), eos_id, tokens.dtype)], axis=1)


def corrupt(tokens: np.ndarray, sentinel_ids: Sequence[int] | np.ndarray, eos_id: int,
            rng: np.random.Generator, noise_density: float = NOISE_DENSITY,
            mean_span_length: float = MEAN_SPAN_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """T5's span corruption of a batch of raw rows: (input_ids [B, inputs_length], labels [B, targets_length]).

    tokens: int [B, tokens_length] (rows of `input_and_target_lengths(inputs_length)[0]` tokens, cut from the
    corpus as T5 packs it); sentinel_ids: the ids of <extra_id_0>, <extra_id_1>, ... in that order (descending in
    T5's vocabularies; `tpuplex.data.t5_tokenizer.sentinel_ids` reads them from a tokenizer), at least as many as a
    row's noise spans; eos_id: the EOS both outputs end with; rng: the batch's Generator,
    `np.random.default_rng([seed, step])`. The outputs have tokens' dtype and `corrupted_lengths(tokens_length)`
    columns; labels are the decoder's targets, ready for T5's shift-right with decoder start = pad.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ConfigError(f"span corruption takes token ids of shape [batch, length], not {tokens.dtype} "
                          f"{list(tokens.shape)}")
    batch, length = tokens.shape
    sentinels = np.asarray(sentinel_ids, dtype=tokens.dtype).reshape(-1)
    noise, spans = span_counts(length, noise_density, mean_span_length)
    if spans > sentinels.size:
        raise ConfigError(f"rows of {length} tokens have {spans} noise spans but the tokenizer has "
                          f"{sentinels.size} sentinel tokens: cut shorter rows or use a tokenizer with more "
                          "<extra_id_N> tokens")
    mask = noise_masks(batch, length, rng, noise_density, mean_span_length)
    return replace_spans(tokens, mask, sentinels, eos_id), replace_spans(tokens, ~mask, sentinels, eos_id)
