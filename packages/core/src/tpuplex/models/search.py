"""Decoding an encoder-decoder, written once: greedy or sampled tokens, or beam search as transformers' `generate`
does it, over a framework's compiled one-token step.

    step(tokens int32 [R], origin int32 [R], position int) -> logits float32 [R, V]

runs the decoder on one token per row at `position` after each row's self-attention cache has been taken from row
`origin[r]` (beam search moves beams between rows; the other searches pass the identity). Every shape is fixed
(R rows, a cache of N positions), so a framework compiles the step once per bucket and never per token; the few
hundred numbers of bookkeeping a token costs stay here, in numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Step = Callable[[np.ndarray, np.ndarray, int], np.ndarray]

HIDDEN = np.float32(-1.0e9)
"""transformers' score of a beam that must not be chosen."""


def generate(step: Step, prompts: Any, start_id: int, eos_id: int, pad_id: int) -> np.ndarray:
    """int32 [B, N]: what `tpuplex.protocol.Prompts` asks for: beam search when prompts.beams > 1, else greedy or
    sampled tokens."""
    rows = prompts.ids.shape[0]
    if prompts.beams > 1:
        return beam(step, rows, prompts.beams, prompts.new_tokens, start_id, eos_id, pad_id, prompts.length_penalty)
    return sampled(step, rows, prompts.new_tokens, start_id, eos_id, pad_id, prompts.temperature, prompts.top_k,
                   np.asarray(prompts.uniforms, np.float32))


def pick(logits: np.ndarray, temperature: float, top_k: int, uniform: np.ndarray) -> np.ndarray:
    """int32 [B]: the most likely token of logits [B, V] (temperature 0), else the token where the CDF of
    softmax(logits / temperature), restricted to the top_k, first exceeds uniform [B] (the decoders' sampler)."""
    if temperature == 0:
        return np.argmax(logits, axis=-1).astype(np.int32)
    scaled = logits.astype(np.float32) / np.float32(temperature)
    if top_k:
        kth = -np.sort(-scaled, axis=-1)[:, min(top_k, scaled.shape[-1]) - 1:][:, :1]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    cdf = np.cumsum(probs / probs.sum(axis=-1, keepdims=True), axis=-1)
    chosen = np.sum(cdf < uniform[:, None] * cdf[:, -1:], axis=-1)
    return np.minimum(chosen, logits.shape[-1] - 1).astype(np.int32)


def sampled(step: Step, rows: int, new_tokens: int, start_id: int, eos_id: int, pad_id: int, temperature: float,
            top_k: int, uniforms: np.ndarray) -> np.ndarray:
    """int32 [rows, new_tokens]: one token a step from `start_id` (`pick`, uniforms [rows, N]); a row that has
    given `eos_id` gives `pad_id` after it, as transformers' greedy search does."""
    identity = np.arange(rows, dtype=np.int32)
    tokens = np.full((rows, new_tokens), pad_id, np.int32)
    current, done = np.full(rows, start_id, np.int32), np.zeros(rows, bool)
    for position in range(new_tokens):
        chosen = pick(step(current, identity, position), temperature, top_k, uniforms[:, position])
        tokens[:, position] = current = np.where(done, pad_id, chosen)
        done |= current == eos_id
        if done.all():
            break
    return tokens


def beam(step: Step, rows: int, beams: int, new_tokens: int, start_id: int, eos_id: int, pad_id: int,
         length_penalty: float = 1.0) -> np.ndarray:
    """int32 [rows, new_tokens]: the best of `beams` hypotheses per row, padded with `pad_id`, as transformers'
    beam search (`GenerationMixin._beam_search`, early_stopping False) finds it: each step keeps the 2 * beams best
    continuations by summed log-probability; those that end (in eos, or at the last position) among the first
    `beams` join the finished hypotheses, scored by sum / generated length ** length_penalty; the best `beams` that
    did not end run on. The search stops when no running beam can beat the worst finished one, or at N tokens.
    `step` runs on rows * beams rows, row r * beams + b being row r's beam b."""
    max_length, keep = 1 + new_tokens, 2 * beams
    running = np.full((rows, beams, max_length), pad_id, np.int32)
    running[:, :, 0] = start_id
    finished_tokens = running.copy()
    running_scores = np.zeros((rows, beams), np.float32)
    running_scores[:, 1:] = HIDDEN  # the beams start equal: only the first one's continuations count
    scores = np.full((rows, beams), HIDDEN, np.float32)
    finished = np.zeros((rows, beams), bool)
    improvable = np.ones((rows, 1), bool)
    among_first = np.arange(keep) < beams
    origin = np.arange(rows * beams, dtype=np.int32)
    first_row = (np.arange(rows) * beams)[:, None]
    for length in range(1, max_length):
        logits = step(running[:, :, length - 1].reshape(-1), origin, length - 1).astype(np.float32)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        vocab = log_probs.shape[-1]
        summed = (log_probs.reshape(rows, beams, vocab) + running_scores[:, :, None]).reshape(rows, -1)
        top = _top(summed, keep)
        top_scores, from_beam, token = np.take_along_axis(summed, top, 1), top // vocab, (top % vocab).astype(np.int32)
        candidates = np.take_along_axis(running, from_beam[:, :, None], 1)
        candidates[:, :, length] = token
        ends = (token == eos_id) | (length + 1 >= max_length)

        still = top_scores + ends * HIDDEN
        chosen = _top(still, beams)
        running = np.take_along_axis(candidates, chosen[:, :, None], 1)
        running_scores = np.take_along_axis(still, chosen, 1)
        origin = np.take_along_axis(from_beam + first_row, chosen, 1).reshape(-1).astype(np.int32)

        ended = ends & among_first[None]
        ended_scores = (top_scores / np.float32(length ** length_penalty) + ~improvable * HIDDEN + ~ended * HIDDEN)
        merged_scores = np.concatenate([scores, ended_scores], axis=1)
        best = _top(merged_scores, beams)
        finished_tokens = np.take_along_axis(np.concatenate([finished_tokens, candidates], 1), best[:, :, None], 1)
        scores = np.take_along_axis(merged_scores, best, 1)
        finished = np.take_along_axis(np.concatenate([finished, ended], 1), best, 1)

        best_running = running_scores[:, :1] / np.float32(length ** length_penalty)
        worst_finished = np.where(finished, scores.min(axis=1, keepdims=True), HIDDEN)
        improvable &= np.any(best_running > worst_finished, axis=-1, keepdims=True)
        if not improvable.any() or ends.all():
            break
    return finished_tokens[:, 0, 1:]


def _top(scores: np.ndarray, count: int) -> np.ndarray:
    """The indices of each row's `count` largest scores, largest first (ties: the first index first)."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :count]
