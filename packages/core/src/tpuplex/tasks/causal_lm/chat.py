"""Chat and instruction data for causal-LM fine-tuning: the loss only on the answers.

A `.jsonl` file whose records hold either

    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}, ...]}
    {"prompt": "...", "completion": "..."}

is a split of conversations (TRL's two formats). So is any table (`tpuplex.data.tables`: .tsv, .csv, .jsonl,
.parquet) with `task.prompt_template` and `task.answer_template`, jinja2 templates over its columns that give each
row's user message and answer (`table_records`), so a labelled dataset is instruction data where it lies.

`messages` are rendered by the checkpoint's chat template (the `chat_template` of its tokenizer_config.json, as
transformers' `apply_chat_template` renders it); a prompt and its completion are joined as they are, the
completion followed by the end-of-text token. Every assistant turn (its
content and the template's end-of-turn tokens) or completion is an answer: the tokens whose text starts inside one
carry weight 1, all others 0, so the loss and the held-out loss are the answers' alone.

Shapes stay static without packing: each conversation is one row of its own tokens (an `Encoded` whose per-token
labels are the answer mask), and the Trainer's length buckets, fitted to the conversations as they are to text
lengths, pad it; no token ever attends across conversations. A conversation longer than data.max_length + 1 tokens
is refused, naming its line. Evaluation adds `answer_accuracy`: the share of held-out conversations answered
exactly by greedy decoding (`answer_accuracy`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import reprlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex.data.batching import Encoded
from tpuplex.data.progress import Progress
from tpuplex.data.tables import DataFile, read_table
from tpuplex.errors import CheckpointError, DataError
from tpuplex.tasks.causal_lm.data import CheckpointTokenizer, next_token_rows
from tpuplex.text_files import read_utf8

FORMATS = ("messages", "prompt")
"""The key that marks a record as a conversation (`messages`) or a prompt with its completion (`prompt`)."""
ROLES = ("system", "user", "assistant", "tool")


def is_chat(path: Path) -> bool:
    """Whether `path` is a `.jsonl` file whose first record is a conversation or a prompt-completion pair."""
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with path.open(encoding="utf-8-sig", errors="replace") as handle:  # a byte-order mark is no part of the JSON
        for line in handle:
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(record, dict) and any(key in record for key in FORMATS)
    return False


def jsonl_records(path: Path, field: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) of each conversation of the `.jsonl` file at `path` (`field` names it in messages)."""
    # read_utf8: a byte-order mark dropped, a byte that is not UTF-8 refused naming its line. StringIO splits lines
    # as a file in text mode does, at \n, \r\n or \r (str.splitlines would also split at U+2028, which a JSON
    # string may hold).
    for number, line in enumerate(io.StringIO(read_utf8(path), newline=None), start=1):
        if line.strip():
            where = f"{path}:{number} ({field})"
            yield where, _record(line, where)


def table_records(file: DataFile, prompt: str, answer: str, tokenizer_dir: Path) -> Iterator[tuple[str, dict]]:
    """(where, record) of each row of a table (`tpuplex.data.tables`) made a conversation by the jinja2 templates
    `prompt` and `answer` over its columns (task.prompt_template and task.answer_template, as lm-evaluation-
    harness's doc_to_text and doc_to_target): the user's message and the assistant's answer, or, for a tokenizer
    without a chat template, a prompt and its completion."""
    templates = row_templates({"task.prompt_template": prompt, "task.answer_template": answer})
    table = read_table(file, (), optional=sorted(set().union(*(names for _, names in templates.values()))))
    for option, (_, names) in templates.items():
        if missing := sorted(names - set(table.columns)):
            raise DataError(f"{option} reads the column {missing[0]!r}, which {file.path} ({file.field}) does not "
                            "have: write the file's column names in the templates")
    chat_form = _renderer(tokenizer_dir) is not None
    for row in range(len(table)):
        values = {column: values[row] for column, values in table.columns.items()}
        where = f"{table.where(row)} ({file.field})"
        question, reply = (render_row(template, values, where) for template, _ in templates.values())
        if not reply.strip():
            raise DataError(f"{where}: task.answer_template renders an empty answer, nothing to learn: fix the "
                            "template or the row")
        yield where, ({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]}
                      if chat_form else {"prompt": question, "completion": reply})


def encode(records: Iterable[tuple[str, dict[str, Any]]], source: str, tokenizer_dir: Path,
           max_length: int) -> Encoded:
    """Each conversation of `records` ((where, record) pairs from `source`: `jsonl_records`, `table_records`) as
    one row of at most max_length + 1 tokens: input_ids [N, max_length + 1] (right-padded), lengths [N], labels
    [N, max_length + 1] int32 (1 on an answer's tokens)."""
    tokenizer = CheckpointTokenizer(tokenizer_dir)
    render = _renderer(tokenizer_dir)
    rows, answers = [], []
    progress = Progress(f"tokenizing {source}", "conversations")
    for where, record in records:
        progress.advance()
        text, spans = _text_and_answers(record, render, where)
        encoding = tokenizer.tokenizer.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, np.int32)
        starts = np.asarray([start for start, _ in encoding.offsets], np.int64)
        mask = np.zeros(len(ids), np.int32)
        for begin, end in spans:
            mask |= ((starts >= begin) & (starts < end)).astype(np.int32)
        if "prompt" in record and tokenizer.end_of_text is not None:  # the completion ends the text
            ids, mask = np.append(ids, np.int32(tokenizer.end_of_text)), np.append(mask, np.int32(1))
        if len(ids) > max_length + 1:
            raise DataError(f"{where} is {len(ids)} tokens long, more than data.max_length + 1 = "
                            f"{max_length + 1}: raise data.max_length (at most the model's context) or "
                            "shorten that conversation")
        if not mask[1:].any():
            raise DataError(f"{where} has no answer tokens to learn from (an empty answer, or only its first "
                            "token): give each conversation an assistant answer")
        rows.append(ids)
        answers.append(mask)
    progress.close()
    if not rows:
        raise DataError(f"{source} has no conversations: give one JSON record per line")
    width = max_length + 1
    input_ids = np.zeros((len(rows), width), np.int32)
    labels = np.zeros((len(rows), width), np.int32)
    for index, (ids, mask) in enumerate(zip(rows, answers, strict=True)):
        input_ids[index, : len(ids)], labels[index, : len(ids)] = ids, mask
    lengths = np.asarray([len(ids) for ids in rows], np.int32)
    return Encoded(input_ids, np.zeros_like(input_ids), lengths, labels)


def rows(encoded: Encoded, first: int, stop: int) -> Encoded:
    """Conversations [first, stop) of `encoded`."""
    part = slice(first, stop)
    return Encoded(encoded.input_ids[part], encoded.token_type_ids[part], encoded.lengths[part], encoded.labels[part])


def answer_width(splits: Iterable[Encoded]) -> int:
    """The most answer tokens any conversation of `splits` has as next-token targets (`answer_rows`' width)."""
    return max(int(encoded.labels[:, 1:].sum(axis=1).max()) for encoded in splits)


def answer_rows(batch: dict[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
    """A batch of conversation rows [B, L + 1] -> input_ids [B, L] (`next_token_rows`'), and each row's answer
    targets alone, K = min(width, L) of them: target_positions int32 [B, K] (the inputs whose next token is an
    answer token, in order, then 0), labels [B, K] (those next tokens, then 0) and weight [B, K] (the row's
    weight, then 0). The decoder computes logits at those positions only (`tpuplex.models.decoder.forward`): the
    loss reads no other, and an LM head over a large vocabulary is a fifth of a small model's forward (SmolLM2's)."""
    rows = next_token_rows(batch)
    weight = rows["weight"] * batch["labels"][:, 1:].astype(np.float32)
    targets = min(width, weight.shape[1])
    if np.any((weight > 0).sum(axis=1) > targets):
        raise RuntimeError(f"a conversation has more than {targets} answer targets: answer_width undercounted")
    # A stable sort puts each row's answer positions first, in their order.
    order = np.argsort(weight <= 0, axis=1, kind="stable")[:, :targets]
    kept = np.take_along_axis(weight, order, axis=1)
    return {"input_ids": rows["input_ids"], "target_positions": np.where(kept > 0, order, 0).astype(np.int32),
            "labels": np.where(kept > 0, np.take_along_axis(rows["labels"], order, axis=1), 0), "weight": kept}


def answer_accuracy(outputs: np.ndarray, weight: np.ndarray) -> float:
    """The share of conversations whose every answer token is the most likely one given the conversation before it
    (outputs [N, P, 2] as `token_metrics` takes them, weight [N, P] on the answers' tokens). That is exactly the
    share that greedy decoding answers token for token: where each answer token is the argmax after the true
    prefix, greedy decoding's prefix stays the true one, through the end-of-turn token, where it stops. (No
    normalisation of case or spaces: a right answer is the same tokens.)"""
    answered = weight.sum(axis=1) > 0
    right = np.all((outputs[..., 1] > 0) | (weight <= 0), axis=1)
    return float(right[answered].mean()) if answered.any() else 0.0


def _record(line: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"{where} is not a JSON record ({error.msg}): write one JSON object per line") from None
    if not isinstance(record, dict) or not any(key in record for key in FORMATS):
        raise DataError(f"{where} is not a conversation: give {{\"messages\": [{{\"role\": ..., \"content\": "
                        "...}, ...]} or {\"prompt\": ..., \"completion\": ...} on every line")
    return record


def _text_and_answers(record: dict[str, Any], render: Callable[..., str] | None,
                      where: str) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text and the character spans [begin, end) of its answers."""
    if "prompt" in record:
        prompt, completion = record.get("prompt"), record.get("completion")
        if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
            raise DataError(f"{where}: \"prompt\" and \"completion\" must both be text, the completion not empty")
        return prompt + completion, [(len(prompt), len(prompt) + len(completion))]
    messages = record["messages"]
    if (not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages)):
        raise DataError(f"{where}: \"messages\" must be a list of {{\"role\": one of {', '.join(ROLES)}, "
                        "\"content\": text}")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where} has no assistant turn: a conversation needs an answer to learn from")
    if not any(m["content"].strip() for m in messages if m["role"] == "assistant"):
        raise DataError(f"{where}: every assistant answer is empty, so only the end of the turn would be learnt: give "
                        "the conversation an answer")
    if render is None:
        raise DataError(f"{where} is a conversation, but the checkpoint's tokenizer has no chat template "
                        "(chat_template in tokenizer_config.json): add one, or write the data as "
                        "{\"prompt\": ..., \"completion\": ...}")
    text = render(messages)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(messages[:index], add_generation_prompt=True), render(messages[: index + 1])
        if not (text.startswith(before) and text.startswith(through)):
            raise DataError(f"{where}: the chat template renders a conversation's start differently from the "
                            "whole, so its answers cannot be found: use a template that renders turns in order")
        spans.append((len(before), len(through)))
    return text, spans


class _Template:
    """The checkpoint's chat template, rendered as transformers renders it (a sandboxed jinja2 environment with
    `raise_exception`, trim_blocks and lstrip_blocks)."""

    def __init__(self, source: str, settings: dict[str, Any], where: Path):
        try:
            from jinja2 import TemplateSyntaxError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise DataError("a chat template needs jinja2: pip install jinja2") from None
        self._where = where

        def raise_exception(message: str) -> None:
            raise DataError(f"the chat template refused a conversation: {message}")

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        try:
            self._template = environment.from_string(source)
        except TemplateSyntaxError as error:
            raise CheckpointError(f"the chat_template of {where} is not a jinja2 template ({error.message}, line "
                                  f"{error.lineno}): fix it there (or take the checkpoint's own file back)") from None
        self._tokens = {key: str(settings[key]) for key in ("bos_token", "eos_token") if settings.get(key)}

    def __call__(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        from jinja2 import TemplateError

        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **self._tokens)
        except TemplateError as error:
            raise CheckpointError(f"the chat_template of {self._where} cannot render a conversation "
                                  f"({type(error).__name__}: {error}): fix the template") from None


def row_templates(sources: dict[str, str]) -> dict[str, tuple[RowTemplate, set[str]]]:
    """Templates over a table's columns (option -> jinja2 source: task.prompt_template, task.answer_template)
    compiled (a column name they misspell fails when rendered), each with the columns it reads."""
    from jinja2 import StrictUndefined, TemplateSyntaxError, meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True,
                                                finalize=_text_only)
    compiled = {}
    for option, source in sources.items():
        try:
            parsed = environment.parse(source)
            compiled[option] = (RowTemplate(option, source, environment.from_string(source)),
                                meta.find_undeclared_variables(parsed))
        except TemplateSyntaxError as error:
            raise DataError(f"{option} = {source!r} is not a jinja2 template ({error.message}): write the "
                            "columns as {{ column }}") from None
    return compiled


@dataclasses.dataclass(frozen=True)
class RowTemplate:
    """The template of `option` (its jinja2 `source`, `compiled`), which writes only text: a value it prints that
    is a JSON null, list or object is refused, never written as Python's str() of it ("None", "[1, 2]")."""

    option: str
    source: str
    compiled: Any

    def render(self, **values: Any) -> str:
        return self.compiled.render(**values)


class _NotText(Exception):
    """A template printed a value that is not text (`_text_only`)."""

    def __init__(self, value: Any):
        super().__init__(value)
        self.value = value


def _text_only(value: Any) -> Any:
    """Each value a `RowTemplate` prints: text, a number or a boolean pass; a null, list or object is refused (an
    undefined value passes on, to fail as StrictUndefined fails when printed)."""
    from jinja2 import Undefined

    if value is None or not isinstance(value, str | int | float | bool | np.generic | Undefined):
        raise _NotText(value)
    return value


def render_row(template: RowTemplate, values: dict[str, Any], where: str) -> str:
    """`template` over one row's `values` (`where` names the row): a row it cannot render, or a value that is not
    text, is the user's error, in one line."""
    try:
        return template.render(**values)
    except _NotText as error:
        kind = {type(None): "a null", list: "a list", dict: "an object"}.get(type(error.value), "a value")
        raise DataError(f"{where}: {template.option} = {template.source!r} prints {kind} "
                        f"({'null' if error.value is None else reprlib.repr(error.value)}), not text: give that row "
                        'text there, or make text of it in the template (e.g. {{ column | join(" ") }})') from None
    except Exception as error:  # noqa: BLE001 - a template runs the user's expressions on the user's data
        raise DataError(f"{template.option} = {template.source!r} cannot render {where} "
                        f"({type(error).__name__}: {error}): fix the template or the row") from None


def user_turn(tokenizer_dir: Path, system: str | None = None) -> Callable[[str], str]:
    """A user's message -> the prompt the checkpoint's chat template makes of it, ending in the assistant's turn;
    after the system message `system` when given (None: none, so a template's own default applies, as
    transformers' `apply_chat_template` does without one)."""
    render = _renderer(tokenizer_dir)
    if render is None:
        raise DataError(f"the checkpoint's tokenizer ({tokenizer_dir}) has no chat template (chat_template in "
                        "tokenizer_config.json): generate without --chat")
    first = [] if system is None else [{"role": "system", "content": system}]
    return lambda message: render([*first, {"role": "user", "content": message}], add_generation_prompt=True)


def _renderer(tokenizer_dir: Path) -> _Template | None:
    """The chat template of the checkpoint's tokenizer_config.json, or None when it has none."""
    path = Path(tokenizer_dir) / "tokenizer_config.json"
    settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for key in ("bos_token", "eos_token"):  # an AddedToken written as a dict
        if isinstance(settings.get(key), dict):
            settings[key] = settings[key].get("content")
    template = settings.get("chat_template")
    return _Template(template, settings, path) if isinstance(template, str) and template else None
