"""`tpuplex generate RUN --prompt TEXT`: continue prompts with a causal-LM run's checkpoint, on any backend.

    generate(path, backend, ["ROMEO:"], new_tokens=500, temperature=0.8, top_k=200, seed=1)

The run's checkpoint is restored on the backend (`workflow.restore`) and its tokenizer (the run's character
vocabulary, or the checkpoint's) reads the prompts. Decoding runs in windows of the run's context C
(`data.max_length`): a window takes a prompt left-padded to a bucket P (a power of two, at least 8, at most C / 2:
longer prompts keep their last C / 2 tokens, as nanoGPT's sample.py crops) and generates C - P tokens in one
compiled loop with a key/value cache; the next window continues from the last C / 2 tokens. So a run compiles one
program for the first bucket and one for every later window, whatever the prompts' lengths. The draws come from
`numpy.random.default_rng(seed)` (`tpuplex.protocol.Prompts`): a seed gives the same text on every backend.
Each text is the new text alone, never the prompt before it: `Run.generate` returns it, the CLI prints it. The
options are checked by type first (`check_number`: `temperature="hot"` is one line naming it), and characters of
a prompt the checkpoint's tokenizer has no token for are counted in one line on stderr.
With `chat`, each prompt is a user's message rendered by the checkpoint's chat template (ending in the assistant's
turn; after a `system` message when one is given), and each answer ends at the end-of-text token. A chat prompt is
never cropped (it would lose the template's start): one longer than C / 2 decodes in a wider window, up to what the
model takes (its positions, `DecoderArch.max_length`), so a run fine-tuned at a short data.max_length still answers
a template that adds its own system prompt; a prompt over half the model's positions is refused.

A text-to-text run (seq2seq, span_corruption: an encoder-decoder) writes a text for each input instead: the
inputs right-padded to a bucket (a power of two, at least 8, at most data.max_length; longer ones cut, their
end-of-text kept), one compiled encoder and decoder step for the batch, greedy, sampled, or by beam search
(`beams` > 1, scored by log-probability / length ** length_penalty); each text ends at the end-of-text token.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
import time
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex.checkpoints import resolve_checkpoint
from tpuplex.commands import run_folder, workflow
from tpuplex.errors import TpuplexError
from tpuplex.protocol import Prompts
from tpuplex.tasks.causal_lm import chat as conversations
from tpuplex.tasks.causal_lm.data import encode_counting_unknown

SMALLEST_BUCKET = 8
TEXT_TO_TEXT = ("seq2seq", "span_corruption")


@dataclasses.dataclass(frozen=True)
class Generated:
    """The prompts, their continuations (text and ids) and how fast they came (new tokens of every prompt per
    second of decoding, compilation included)."""

    prompts: list[str]
    texts: list[str]
    ids: list[np.ndarray]
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return sum(len(ids) for ids in self.ids) / self.seconds


def bucket(length: int, context: int) -> int:
    """The prompt length a window compiles for: the smallest power of two >= length (at least 8), at most
    context // 2."""
    return min(max(SMALLEST_BUCKET, 1 << max(0, length - 1).bit_length()), context // 2)


def left_padded(rows: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) int32 [B, width]: each row's last `width` ids, right-aligned."""
    ids, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
    for index, row in enumerate(rows):
        kept = row[-width:]
        ids[index, width - len(kept):], mask[index, width - len(kept):] = kept, 1
    return ids, mask


def generate(path: str | Path, backend_name: str | None, prompts: list[str], new_tokens: int,
             temperature: float = 0.0, top_k: int = 0, seed: int = 0, cache: bool = True,
             chat: bool = False, system: str | None = None, beams: int = 1,
             length_penalty: float = 1.0) -> Generated:
    """`new_tokens` tokens after each of `prompts` from the checkpoint `path` names (see the module), on
    `backend_name` (None: the one the run trained on); `system`: the system message of every `chat` prompt;
    `beams`, `length_penalty`: a text-to-text run's beam search."""
    check_options(new_tokens, temperature, top_k, seed, prompts, chat, system, beams, length_penalty)
    found = run_folder.locate(path)
    check_run(found, beams)
    backend_name = backend_name or run_folder.trained_backend(found.run_dir)
    return generate_restored(found, *workflow.restore(found, backend_name, model_only=True), prompts, new_tokens,
                             temperature, top_k, seed, cache, chat, system, beams, length_penalty)


def check_options(new_tokens: int, temperature: float, top_k: int, seed: int, prompts: list[str],
                  chat: bool = False, system: str | None = None, beams: int = 1,
                  length_penalty: float = 1.0) -> None:
    """The sampling options and the prompts, checked before the run is read."""
    numbers_given = (("tokens", "--tokens", new_tokens, int), ("temperature", "--temperature", temperature, float),
                     ("top_k", "--top-k", top_k, int), ("seed", "--seed", seed, int), ("beams", "--beams", beams, int),
                     ("length_penalty", "--length-penalty", length_penalty, float))
    for name, flag, value, kind in numbers_given:
        check_number(name, flag, value, kind)
    if not isinstance(chat, bool):
        raise TpuplexError(f"chat = {reprlib.repr(chat)} is a {type(chat).__name__}: chat takes True or False")
    if beams < 1:
        raise TpuplexError(f"--beams {beams}: give 1 (no beam search) or more beams")
    if beams > 1 and temperature:
        raise TpuplexError(f"--beams {beams} --temperature {temperature}: beam search is not sampled: give "
                           "--temperature 0 (the default) with beams")
    if not math.isfinite(length_penalty):
        raise TpuplexError(f"--length-penalty {length_penalty}: give a finite number (1.0: log-probability per "
                           "token, 0: summed)")
    if system is not None and not chat:
        raise TpuplexError("a system message (--system, system=) is a chat's: add --chat (chat=True), or leave it out")
    if system is not None and not isinstance(system, str):
        raise TpuplexError(f"system = {system!r}: give the system message as text")
    if new_tokens < 1:
        raise TpuplexError(f"--tokens {new_tokens}: generate at least 1 token")
    if not (math.isfinite(temperature) and temperature >= 0) or top_k < 0:
        raise TpuplexError(f"--temperature {temperature} --top-k {top_k}: use a finite temperature >= 0 (0: greedy) "
                           "and a top-k >= 0 (0: every token)")
    if not 0 <= seed < 2**63:
        raise TpuplexError(f"--seed {seed}: use a seed in [0, 2^63)")
    if not prompts or not all(prompts):
        raise TpuplexError("give each prompt some text: --prompt TEXT (or --prompt-file FILE)")


def check_number(name: str, flag: str, value: Any, kind: type) -> None:
    """`value` of the option `name` (`flag` on the command line) is a number of `kind` (int, or float: any real
    number), not a bool or a string."""
    wanted = numbers.Integral if kind is int else numbers.Real
    if isinstance(value, bool) or not isinstance(value, wanted):
        what = "a whole number" if kind is int else "a number"
        raise TpuplexError(f"{name} = {reprlib.repr(value)} is a {type(value).__name__}: {name} ({flag}) takes "
                           f"{what} ({kind.__name__})")


def check_run(found: run_folder.Found, beams: int = 1) -> None:
    """The run can generate: a causal_lm run with a context of at least two prompt buckets, or a text-to-text run;
    beam search is a text-to-text run's."""
    task = found.config.task.name
    if task in TEXT_TO_TEXT:
        return
    if task != "causal_lm":
        raise TpuplexError(f"{found.run_dir} is a {task} run: tpuplex generate continues text with a causal_lm run "
                           "(a decoder) or writes text with a seq2seq or span_corruption run (T5)")
    if beams > 1:
        raise TpuplexError(f"--beams {beams}: beam search decodes a text-to-text run (T5); a causal_lm run is greedy "
                           "or sampled: leave --beams out")
    context = found.config.data.max_length
    if context < 2 * SMALLEST_BUCKET:
        raise TpuplexError(f"the run's context (data.max_length = {context}) is too short to generate in windows: "
                           f"train with data.max_length >= {2 * SMALLEST_BUCKET}")


def generate_restored(found: run_folder.Found, experiment: Any, state: Any, prompts: list[str], new_tokens: int,
                      temperature: float = 0.0, top_k: int = 0, seed: int = 0, cache: bool = True,
                      chat: bool = False, system: str | None = None, beams: int = 1,
                      length_penalty: float = 1.0) -> Generated:
    """`generate` with the checkpoint already restored (`workflow.restore`) and checked (`check_options`,
    `check_run`)."""
    if found.config.task.name in TEXT_TO_TEXT:
        if chat:
            raise TpuplexError("--chat renders a decoder's chat template: a text-to-text run takes its inputs as "
                               "they are: leave --chat out")
        return text_to_text(found, experiment, state, prompts, new_tokens, temperature, top_k, seed, beams,
                            length_penalty)
    context = found.config.data.max_length
    template = (conversations.user_turn(resolve_checkpoint(found.config.model.checkpoint), system) if chat
                else None)
    vocabulary = experiment.data.vocabulary
    texts = [template(prompt) if template else prompt for prompt in prompts]
    rows = encode_counting_unknown(vocabulary, texts, "the prompts")
    if not all(len(row) for row in rows):
        raise TpuplexError("a prompt gives no tokens: give each prompt some text")
    if chat:  # cropped, a prompt would lose the template's start: the window grows to hold it instead
        context = chat_context(max(map(len, rows)), context, model_positions(experiment, context))
    rng = np.random.default_rng(seed)
    generated: list[np.ndarray] = [np.zeros(0, np.int32) for _ in rows]
    width = bucket(max(map(len, rows)), context)
    started = time.perf_counter()
    while len(generated[0]) < new_tokens:
        count = min(new_tokens - len(generated[0]), context - width)
        ids, mask = left_padded([np.concatenate([row, done]) for row, done in zip(rows, generated, strict=True)],
                                width)
        window = Prompts(ids, mask, count, temperature, top_k, rng.random((len(rows), count)).astype(np.float32),
                         cache)
        tokens = experiment.backend.generate(state, window)
        generated = [np.concatenate([done, new]) for done, new in zip(generated, tokens, strict=True)]
        width = context // 2
    seconds = time.perf_counter() - started
    if chat:  # an answer ends at the end-of-text token
        generated = [ids[: np.flatnonzero(np.append(ids == vocabulary.end_of_text, True))[0]] for ids in generated]
    return Generated(prompts, [vocabulary.decode(ids) for ids in generated], generated, seconds)


def text_to_text(found: run_folder.Found, experiment: Any, state: Any, inputs: list[str], new_tokens: int,
                 temperature: float, top_k: int, seed: int, beams: int, length_penalty: float) -> Generated:
    """The text an encoder-decoder writes for each input (see the module): at most `new_tokens` tokens, ending at
    end-of-text."""
    vocabulary = experiment.data.vocabulary
    end = vocabulary.end_of_text
    longest = found.config.data.max_length
    rows = [np.append(ids[: longest - 1], np.int32(end))
            for ids in encode_counting_unknown(vocabulary, inputs, "the prompts")]
    width = min(max(SMALLEST_BUCKET, 1 << (max(map(len, rows)) - 1).bit_length()), longest)
    ids, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
    for index, row in enumerate(rows):
        ids[index, : len(row)], mask[index, : len(row)] = row, 1
    uniforms = np.random.default_rng(seed).random((len(rows), new_tokens)).astype(np.float32)
    started = time.perf_counter()
    tokens = experiment.backend.generate(state, Prompts(ids, mask, new_tokens, temperature, top_k, uniforms,
                                                        beams=beams, length_penalty=length_penalty))
    seconds = time.perf_counter() - started
    written = [row[: np.flatnonzero(np.append(row == end, True))[0]] for row in tokens]
    return Generated(inputs, [vocabulary.tokenizer.decode([int(i) for i in row], skip_special_tokens=True)
                              for row in written], written, seconds)


def model_positions(experiment: Any, context: int) -> int:
    """The longest sequence the run's model takes (a decoder's position table, or its configured context for rotary
    positions); `context` where the model does not say."""
    arch = getattr(getattr(experiment.trainer, "model", None), "arch", None)
    positions = getattr(arch, "max_length", None)
    return positions if isinstance(positions, int) and positions > 0 else context


def chat_context(longest: int, context: int, positions: int) -> int:
    """The decoding window for chat prompts of at most `longest` tokens: the run's `context` (data.max_length)
    where half of it holds them, else one whose half does (twice their bucket), at most the model's `positions`; a
    prompt over half of those leaves too little room for an answer and is refused."""
    if longest <= context // 2:
        return context
    if longest > positions // 2:
        raise TpuplexError(f"a --chat prompt is {longest} tokens in the chat template, more than half the "
                           f"{positions} positions the model takes (the rest is for the answer): shorten it (or its "
                           "system message)")
    return min(positions, max(context, 2 * bucket(longest, 2 * positions)))
