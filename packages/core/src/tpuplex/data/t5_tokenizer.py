"""A T5 tokenizer trained on your corpus with the `tokenizers` library, and the sentinel tokens span corruption needs.

`train_t5_tokenizer` is HF's examples/flax/language-modeling/t5_tokenizer_model.py (`SentencePieceUnigramTokenizer`,
what `run_t5_mlm_flax.py`'s README trains before pre-training): a SentencePiece-like Unigram model with NMT and
NFKC normalisation, runs of spaces folded, lower-cased, Metaspace ("▁") words with digits and punctuation split
off, and EOS appended to every text. It is laid out as T5's own vocabularies are: pad = 0, eos = 1, unk = 2, the
learnt pieces, then the sentinels <extra_id_99> .. <extra_id_0> as the top ids (<extra_id_0> is the largest id,
vocab_size - 1), special tokens that text never splits. The folder holds `tokenizer.json` (what tpuplex reads)
and a `tokenizer_config.json` with which transformers' AutoTokenizer loads it as it is, ids and all (4.57, what
`run_t5_mlm_flax.py --tokenizer_name` takes, and 5.x). Its class is PreTrainedTokenizerFast: transformers 5's
T5Tokenizer rebuilds T5's own normaliser (no lower-casing) around the vocabulary, so text would tokenize otherwise.

`graph_tokenizer` gives what a TensorFlow graph needs to tokenize as such a tokenizer does (a text-to-text
SavedModel that takes text: `tpuplex_tf.tasks.seq2seq`): its Unigram pieces and scores as a SentencePiece model,
which tensorflow-text runs, and the steps around the model the graph writes in TensorFlow's string ops.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers.processors import TemplateProcessing

from tpuplex.data.tokenize import load_tokenizer
from tpuplex.errors import ConfigError, DataError, TpuplexError

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
SENTINELS = 100
"""T5's count of sentinel tokens (<extra_id_0> .. <extra_id_99>)."""
REPLACEMENT = "▁"


def sentinel_token(index: int) -> str:
    """The text of the sentinel that replaces a row's `index`-th span: <extra_id_{index}>."""
    return f"<extra_id_{index}>"


def _pipeline(lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Nmt(), normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
        + ([normalizers.Lowercase()] if lowercase else []))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement=REPLACEMENT, prepend_scheme="always"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation(),
    ])
    tokenizer.decoder = decoders.Metaspace(replacement=REPLACEMENT, prepend_scheme="always")
    tokenizer.post_processor = TemplateProcessing(single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}",
                                                  special_tokens=[(EOS, EOS_ID)])
    return tokenizer


def train_t5_tokenizer(texts: Iterable[str], vocab_size: int, folder: str | Path, *, sentinels: int = SENTINELS,
                       lowercase: bool = True) -> Path:
    """Train a T5 tokenizer on `texts` and save it in `folder` (created): returns the folder.

    vocab_size: the whole vocabulary, sentinels included (T5's is 32,100 = 32,000 pieces + 100 sentinels); a small
    corpus may yield fewer pieces, and the vocabulary is then that much smaller, the sentinels still at its top
    (read the size from the saved tokenizer, `Tokenizer.get_vocab_size()`). sentinels: how many <extra_id_N>.
    lowercase: as HF's example (T5's own vocabulary keeps case).
    """
    if sentinels < 1:
        raise ConfigError(f"sentinels = {sentinels} must be at least 1: T5 has {SENTINELS}")
    pieces = vocab_size - sentinels
    if pieces < 16:
        raise ConfigError(f"vocab_size = {vocab_size} leaves {pieces} pieces beside {sentinels} sentinels: "
                          f"use at least {sentinels + 16} (T5 uses 32,100)")
    tokenizer = _pipeline(lowercase)
    trainer = trainers.UnigramTrainer(vocab_size=pieces, special_tokens=[PAD, EOS, UNK], unk_token=UNK,
                                      show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    vocab = json.loads(tokenizer.to_str())["model"]["vocab"]
    if [piece for piece, _ in vocab[:3]] != [PAD, EOS, UNK]:
        raise DataError(f"the trained vocabulary begins {vocab[:3]}, not {PAD}, {EOS}, {UNK}: no text to train on?")
    # Sentinels as the top ids, <extra_id_0> last (T5's layout), each a special token matched before the model.
    vocab = [(piece, score) for piece, score in vocab] + [(sentinel_token(i), 0.0) for i in reversed(range(sentinels))]
    tokenizer.model = models.Unigram(vocab, unk_id=UNK_ID, byte_fallback=False)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in (PAD, EOS, UNK)])
    tokenizer.add_special_tokens([AddedToken(sentinel_token(i), special=True, normalized=False)
                                  for i in range(sentinels)])
    assert tokenizer.token_to_id(sentinel_token(0)) == len(vocab) - 1

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # model_input_names: T5 takes no token_type_ids, which a PreTrainedTokenizerFast otherwise returns (Flax T5
    # refuses them in run_t5_mlm_flax.py).
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD, "eos_token": EOS, "unk_token": UNK,
              "extra_ids": sentinels, "additional_special_tokens": [sentinel_token(i) for i in range(sentinels)],
              "model_input_names": ["input_ids", "attention_mask"]}
    _publish(folder / "tokenizer.json", tokenizer.to_str(pretty=True))
    _publish(folder / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    return folder


def _publish(path: Path, text: str) -> None:
    """Write `path` whole or not at all."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def sentinel_ids(tokenizer_dir: str | Path) -> list[int]:
    """The ids of <extra_id_0>, <extra_id_1>, ... in the tokenizer of `tokenizer_dir`, as many as it has in a row
    from 0 (descending ids in T5's vocabularies): what `tpuplex.data.span_corruption.corrupt` replaces spans with.

    Raises DataError (a TpuplexError) when the folder has no tokenizer or its tokenizer has no <extra_id_0>.
    """
    tokenizer = load_tokenizer(Path(tokenizer_dir), max_length=1)  # truncation does not change token_to_id
    ids: list[int] = []
    while (token_id := tokenizer.token_to_id(sentinel_token(len(ids)))) is not None:
        ids.append(token_id)
    if not ids:
        raise DataError(f"the tokenizer in {tokenizer_dir} has no sentinel tokens <extra_id_0>.. for span "
                        "corruption: train one with tpuplex.data.t5_tokenizer.train_t5_tokenizer(texts, "
                        "vocab_size, folder) or use a T5 checkpoint's tokenizer")
    return ids


@dataclass(frozen=True)
class GraphTokenizer:
    """A tokenizer `train_t5_tokenizer` wrote, in the pieces a TensorFlow graph tokenizes with.

    sentencepiece: the Unigram pieces and scores as a serialized SentencePiece ModelProto (identity normaliser, no
      dummy prefix: the graph normalises and splits the text into Metaspace words first, and the model segments
      each word by the same Viterbi search over the same scores). pieces: each id's text, for decoding.
    special: the added tokens (pad, eos, unk, the sentinels) and their ids, matched in the raw text before
      normalisation and skipped when decoding. lowercase: whether the normaliser lower-cases.
    """

    sentencepiece: bytes
    pieces: tuple[str, ...]
    special: dict[str, int]
    lowercase: bool


def graph_tokenizer(tokenizer: Tokenizer) -> GraphTokenizer:
    """`tokenizer` as a `GraphTokenizer`.

    Raises TpuplexError when it is not a tokenizer `train_t5_tokenizer` writes (its normaliser, pre-tokenizer and
    decoder are what the graph reproduces, step for step; another tokenizer would tokenize otherwise).
    """
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    spec = json.loads(tokenizer.to_str())
    pipeline = {part: spec.get(part) for part in ("normalizer", "pre_tokenizer", "decoder")}
    lowercase = next((case for case in (True, False)
                      if pipeline == {part: json.loads(_pipeline(case).to_str())[part] for part in pipeline}), None)
    model = spec.get("model", {})
    if lowercase is None or model.get("type") != "Unigram" or model.get("byte_fallback"):
        raise TpuplexError("the run's tokenizer is not a T5 tokenizer tpuplex prepare trains (train_t5_tokenizer's "
                           "Unigram, normaliser and pre-tokenizer), which a SavedModel can run on text: export this "
                           "run with --format hf and tokenize beside the server")
    special = {token["content"]: token["id"] for token in spec.get("added_tokens", []) if token.get("special")}
    proto = model_pb2.ModelProto()
    for index, (piece, score) in enumerate(model["vocab"]):
        entry = proto.pieces.add(piece=piece, score=score)
        entry.type = (entry.UNKNOWN if index == model["unk_id"] else entry.CONTROL if piece in special
                      else entry.NORMAL)
    proto.trainer_spec.model_type = model_pb2.TrainerSpec.UNIGRAM
    proto.trainer_spec.vocab_size = len(model["vocab"])
    proto.trainer_spec.unk_id, proto.trainer_spec.pad_id = model["unk_id"], special.get(PAD, -1)
    proto.trainer_spec.eos_id, proto.trainer_spec.bos_id = special.get(EOS, -1), -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = False
    return GraphTokenizer(proto.SerializeToString(), tuple(piece for piece, _ in model["vocab"]), special, lowercase)
