"""Text-to-text training in Keras (TensorFlow): the cross-entropy of an encoder-decoder's logits over the target
tokens, and the SavedModel that takes texts, tokenizes them, decodes greedily and detokenizes, all in its graph."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tpuplex.data.t5_tokenizer import GraphTokenizer, graph_tokenizer
from tpuplex.errors import TpuplexError
from tpuplex.models import t5
from tpuplex.models.t5 import INPUTS
from tpuplex_tf import tasks as tasks_tf


class Module(tasks_tf.TaskModule):
    def model_inputs(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, ...]:
        """The model's call: input_ids, attention_mask int32 [B, S], decoder_input_ids [B, T]."""
        return tuple(batch[name] for name in INPUTS)

    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Per-target-token cross-entropy [B, T] of logits [B, T, V]."""
        return tasks_tf.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 [B, T, 2]: each target token's cross-entropy and 1.0 where it is the most likely token."""
        return tasks_tf.token_outputs(outputs, batch["labels"])

    def serving(self, model: Any, data: Any) -> tasks_tf.Serving:
        """The SavedModel's endpoints. `serving_default`: text, a string [batch] of input texts (as `Run.generate`
        takes them) -> texts, a string [batch] (what greedy decoding writes, as `Run.generate` returns it), and
        sequences int32 [batch, T]. `token_ids`: input_ids, attention_mask int32 [batch, S] (each input's tokens
        then </s>, right-padded to the run's `data.max_length` S; T5's relative positions are laid out for that
        static length) -> sequences int32 [batch, T]: the T target tokens (the run's target length), </s> then
        padding after each text's end."""
        length, targets = next((split.input_ids.shape[1], split.labels.shape[1])
                               for split in (data.train, *data.eval.values()) if split is not None)
        tokenizer = TextTokenizer(_graph_tokenizer(data.vocabulary.tokenizer), length)

        def serve_text(text: tf.Tensor) -> dict[str, tf.Tensor]:
            sequences = greedy(model, *tokenizer.encode(text), targets)
            return {"texts": tokenizer.decode(sequences), "sequences": sequences}

        def serve_ids(input_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"sequences": greedy(model, input_ids, attention_mask, targets)}

        ids = [tf.TensorSpec([None, length], tf.int32, name=name) for name in INPUTS[:2]]
        return tasks_tf.Serving({"serving_default": (serve_text, [tf.TensorSpec([None], tf.string, name="text")]),
                                 "token_ids": (serve_ids, ids)}, (tokenizer,))


def _graph_tokenizer(tokenizer: Any) -> GraphTokenizer:
    try:
        import sentencepiece  # noqa: F401 (writes the Unigram as its model)
        import tensorflow_text  # noqa: F401 (the graph's ops: SentencePiece, NFKC, regex split)
    except ImportError as missing:
        raise TpuplexError(f"a text-to-text SavedModel tokenizes its texts in the graph, which needs {missing.name}: "
                           "pip install sentencepiece && pip install --no-deps tensorflow-text==2.21.* (--no-deps: "
                           "its wheel asks for the full tensorflow package beside tensorflow-cpu)") from missing
    return graph_tokenizer(tokenizer)


PRE_TOKEN = r"▁?[^▁0-9\pP[:punct:]]+|▁|[0-9]|[\pP[:punct:]]"
"""One pre-token of a Metaspace text, as `train_t5_tokenizer`'s pre-tokenizer cuts it: a word with its leading ▁
(Metaspace's split), an ASCII digit (Digits), or a punctuation mark (Punctuation: ASCII's and Unicode's P)."""
NMT_DROPPED = r"[\x01-\x08\x0b\x0e-\x1f\x7f\x{8f}\x{9f}]"
NMT_SPACES = r"[\t\n\x0c\r\x{1680}\x{200b}-\x{200f}\x{2028}\x{2029}\x{2581}\x{feff}\x{fffd}]"
"""The characters `tokenizers`' Nmt normaliser drops, and those it makes spaces (read off it, code point by
code point)."""


class TextTokenizer(tf.Module):
    """A `GraphTokenizer` in TensorFlow ops: texts to the ids `tokenizers` gives them, and ids back to texts.

    Each step is the tokenizer's own: added tokens matched in the raw text; Nmt, NFKC, runs of spaces folded,
    lower-casing; Metaspace (spaces as ▁, one before each segment that does not start with one), digits and
    punctuation split off; then each pre-token's Viterbi segmentation by SentencePiece over the same pieces and
    scores. tests/tf/test_t5.py checks it against `tokenizers` on GLUE's and Shakespeare's texts.
    """

    def __init__(self, spec: GraphTokenizer, length: int):
        import tensorflow_text

        super().__init__()
        self.length, self.lowercase = length, spec.lowercase
        self.end_of_text = spec.special["</s>"]
        self.sentencepiece = tensorflow_text.SentencepieceTokenizer(spec.sentencepiece, out_type=tf.int32)
        self.special_ids = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            list(spec.special), list(spec.special.values()), tf.string, tf.int32), default_value=-1)
        self.special_pattern = "|".join(rf"\Q{token}\E" for token in spec.special)
        self.pieces = tf.constant(spec.pieces)
        special_ids = set(spec.special.values())
        self.is_special = tf.constant([index in special_ids for index in range(len(spec.pieces))])

    def encode(self, text: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """text string [B] -> input_ids, attention_mask int32 [B, S]: each text's tokens then </s>, cut to S
        (the last kept token made </s>) and right-padded with 0, as the run's inputs were."""
        import tensorflow_text

        segments = tensorflow_text.regex_split(text, self.special_pattern, self.special_pattern)  # [B, segments]
        flat = segments.flat_values
        special = self.special_ids.lookup(flat)
        normal = tf.where(special < 0, self.normalize(flat), "")
        words = tensorflow_text.regex_split(normal, PRE_TOKEN, PRE_TOKEN)  # [segments, words]
        pieces = self.sentencepiece.tokenize(words.flat_values)  # [words, pieces]
        pieces = words.with_flat_values(pieces).merge_dims(1, 2)  # [segments, pieces]
        matched = tf.RaggedTensor.from_row_lengths(special[special >= 0], tf.cast(special >= 0, tf.int64))
        tokens = segments.with_flat_values(tf.concat([matched, pieces], axis=1)).merge_dims(1, 2)  # [B, tokens]
        tokens = tokens[:, : self.length - 1]
        rows = tokens.nrows()
        tokens = tf.concat([tokens, tf.fill([rows, 1], self.end_of_text)], axis=1)
        mask = tf.sequence_mask(tokens.row_lengths(), self.length, tf.int32)
        return tokens.to_tensor(0, shape=[rows, self.length]), mask

    def normalize(self, text: tf.Tensor) -> tf.Tensor:
        """Nmt, NFKC, runs of spaces folded, lower-casing, then Metaspace's ▁ (a segment that starts with a space
        gets no second)."""
        import tensorflow_text

        text = tf.strings.regex_replace(tf.strings.regex_replace(text, NMT_DROPPED, ""), NMT_SPACES, " ")
        text = tf.strings.regex_replace(tensorflow_text.normalize_utf8(text, "NFKC"), " {2,}", " ")
        if self.lowercase:
            text = tf.strings.lower(text, encoding="utf-8")
        return tf.strings.regex_replace(tf.strings.regex_replace(text, " ", "▁"), "^([^▁])", "▁\\1")

    def decode(self, sequences: tf.Tensor) -> tf.Tensor:
        """sequences int32 [B, T] -> string [B]: each row's tokens before its first </s>, special tokens skipped,
        ▁ as spaces, the first token's leading space dropped (Metaspace's decoder)."""
        ended = tf.cumsum(tf.cast(tf.equal(sequences, self.end_of_text), tf.int32), axis=1) > 0
        kept = ~ended & ~tf.gather(self.is_special, sequences)
        text = tf.strings.reduce_join(tf.where(kept, tf.gather(self.pieces, sequences), ""), axis=1)
        return tf.strings.regex_replace(tf.strings.regex_replace(text, "▁", " "), "^ ", "")


def greedy(model: Any, input_ids: tf.Tensor, attention_mask: tf.Tensor, new_tokens: int) -> tf.Tensor:
    """int32 [B, new_tokens]: greedy decoding inside the graph (`tpuplex.models.search` runs on the host instead):
    the encoder once, then one decoder step a token in a while loop over the self-attention cache; each row pads
    after its </s>."""
    ops, params, arch = model.ops(), model.params(), model.arch
    cross = t5.cross_keys(ops, params, arch, t5.encode(ops, params, arch, input_ids, attention_mask))
    rows = tf.shape(input_ids)[0]
    shape = tf.stack([rows, new_tokens, arch.num_heads, arch.head_dim])
    cache = tuple((tf.zeros(shape, model.compute_dtype),) * 2 for _ in range(arch.decoder_layers))

    def step(position, tokens, done, cache, written):
        logits, cache = t5.decode(ops, params, arch, tokens[:, None], None, attention_mask, cross=cross, cache=cache,
                                  cache_index=position)
        chosen = tf.where(done, arch.pad_id, tf.argmax(logits[:, 0], axis=-1, output_type=tf.int32))
        return position + 1, chosen, done | tf.equal(chosen, arch.eos_id), cache, written.write(position, chosen)

    start = tf.fill([rows], tf.constant(arch.decoder_start_id, tf.int32))
    *_, written = tf.while_loop(lambda position, *_: position < new_tokens, step,
                                (tf.constant(0), start, tf.zeros([rows], tf.bool), cache,
                                 tf.TensorArray(tf.int32, size=new_tokens)))
    return tf.transpose(written.stack())
