"""Tiny random checkpoints of every supported family, written offline by transformers' own classes.

Each folder is what `save_pretrained` writes for the family's pre-training model (so base names, prefixes and
pre-training heads are as real checkpoints have them) plus a `tokenizer.json` of the family's kind, trained
offline with HF tokenizers on `corpus`: WordPiece (BERT, DistilBERT, ELECTRA), byte-level BPE (RoBERTa), Unigram
(ALBERT). Weights get noise on top of HF's initialisation and `initializer_range` is 0.2, so logits are far from
zero and a wrong wire shows. Used by the test sessions and by the parity scenario's second family.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import torch

FAMILIES = ("bert", "roberta", "distilbert", "electra", "albert")
SENTENCES = (
    "The company said its quarterly profit rose sharply.", "Shares fell after the announcement on Monday.",
    "He did not expect the results to be so strong.", "A new model was trained on the data set.",
    "The committee will meet again next week to decide.", "Researchers reported similar findings last year.",
    "Prices were unchanged in early trading.", "She said the plan would cut costs by a third.",
)


SPECIAL = {"bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
           "albert": ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
           "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]}
"""Each tokenizer kind's special tokens, first in its vocabulary (the mask token included, for masked-LM tests)."""


def tiny_config(family: str, vocab_size: int = 120, max_length: int = 64) -> transformers.PretrainedConfig:
    """Hidden 32, 4 heads, feed-forward 64, two layers (ALBERT: four layers over two groups of two, so blocks run
    0 1 0 1 2 3 2 3; ELECTRA and ALBERT: embeddings of 16, projected)."""
    sizes = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=max_length, initializer_range=0.2)
    if family == "bert":
        return transformers.BertConfig(**sizes)
    if family == "roberta":  # positions start after padding_idx = 1
        return transformers.RobertaConfig(**{**sizes, "max_position_embeddings": max_length + 2},
                                          type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    if family == "distilbert":
        return transformers.DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                             max_position_embeddings=max_length, initializer_range=0.2)
    if family == "electra":
        return transformers.ElectraConfig(**sizes, embedding_size=16)
    if family == "albert":
        return transformers.AlbertConfig(**{**sizes, "num_hidden_layers": 4}, embedding_size=16,
                                         num_hidden_groups=2, inner_group_num=2)
    raise ValueError(f"unknown family {family!r}: use one of {', '.join(FAMILIES)}")


def write_checkpoint(family: str, directory: str | Path, seed: int = 0, corpus: Sequence[str] = SENTENCES,
                     vocab_size: int = 120, max_length: int = 64) -> Path:
    """config.json, model.safetensors (the family's pre-training model) and tokenizer.json in `directory`."""
    directory = Path(directory)
    torch.manual_seed(seed)
    model = transformers.AutoModelForPreTraining.from_config(tiny_config(family, vocab_size, max_length))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(directory)
    tokenizer(family, corpus, vocab_size).save(str(directory / "tokenizer.json"))
    return directory


def tokenizer(family: str, corpus: Sequence[str], vocab_size: int) -> Tokenizer:
    """The family's kind of tokenizer for `corpus`, with its special tokens and pair template.

    The byte-level BPE is trained (its trainer is deterministic); the WordPiece and Unigram vocabularies are built
    from word counts instead, because their trainers order ties differently from one process to the next.
    """
    if family == "roberta":
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        # The whole byte alphabet when the vocabulary has room for it, so no character of unseen text is lost.
        alphabet = pre_tokenizers.ByteLevel.alphabet() if vocab_size > 300 else []
        bpe.train_from_iterator(corpus, trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL["roberta"], initial_alphabet=alphabet))
        bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        bpe.add_special_tokens(SPECIAL["roberta"])
        return bpe
    words = Counter(word for text in corpus for word in re.findall(r"\w+|[^\w\s]", text.lower()))
    characters = sorted({character for word in words for character in word})
    frequent = [word for word, _ in sorted(words.items(), key=lambda item: (-item[1], item[0]))]
    if family == "albert":
        pieces = [*SPECIAL["albert"], "\u2581", *characters,
                  *(f"\u2581{word}" for word in frequent)][:vocab_size]
        total = sum(words.values()) + len(pieces)
        result = Tokenizer(models.Unigram([(piece, math.log((words.get(piece.lstrip("\u2581"), 0) + 1) / total))
                                           for piece in pieces], unk_id=1))
        result.normalizer = normalizers.Lowercase()
        result.pre_tokenizer = pre_tokenizers.Metaspace()
    else:
        pieces = [*SPECIAL["bert"], *characters, *(f"##{c}" for c in characters), *frequent]
        result = Tokenizer(models.WordPiece({piece: index for index, piece in enumerate(pieces[:vocab_size])},
                                            unk_token="[UNK]"))
        result.normalizer = normalizers.BertNormalizer(lowercase=True)
        result.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    result.add_special_tokens(SPECIAL["albert" if family == "albert" else "bert"])
    cls, sep = result.token_to_id("[CLS]"), result.token_to_id("[SEP]")
    result.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return result
