"""Tokenized splits in prepared shards (`tpuplex.data.shards`): what `Encoded` holds, read row by row.

Every text task's split reaches the Trainer this way: the token cache (`tpuplex.data.tokenize`,
`tpuplex.tasks.masked_lm.data`) writes each tokenized split once as a prepared folder, and a run batches it with
`PreparedTokens`, which reads only the rows a batch needs. A record is one row: input_ids and token_type_ids
(int32 [max_length], right-padded), its length, and its label (int32 or float32, [] or [max_length]); `lengths`
is also a column, for the length buckets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tpuplex.data.batching import Encoded, SplitDigest, token_rows
from tpuplex.data.shards import Field, ReadStats, Shards, ShardWriter, open_shards

KIND = "tokens"


@dataclasses.dataclass(frozen=True)
class PreparedTokens:
    """A tokenized split read lazily from its shards; the Batcher batches it as it batches an `Encoded`."""

    shards: Shards

    def __len__(self) -> int:
        return len(self.shards)

    @property
    def max_length(self) -> int:
        return int(self.shards.meta["max_length"])

    @property
    def max_token_id(self) -> int:
        return int(self.shards.meta["max_token_id"])

    @property
    def token_count(self) -> int:
        return int(self.shards.meta["token_count"])

    @property
    def lengths(self) -> np.ndarray:
        """int32 [N]: every row's token count (read once, from the shards' `lengths` columns)."""
        return self.shards.column("lengths")

    def rows(self, indices: np.ndarray, length: int) -> dict[str, np.ndarray]:
        """As `Encoded.rows`: the rows `indices` read from their shards, cut to `length` tokens."""
        read = self.shards.read(indices)
        return token_rows(read["input_ids"], read["token_type_ids"], read["lengths"], read["labels"], length)

    @property
    def read_stats(self) -> ReadStats:
        """What this process has read of the split so far."""
        return self.shards.stats

    def fingerprint(self) -> str:
        """The fingerprint the split had in memory (`Encoded.fingerprint`), recorded when it was written."""
        return self.shards.meta["fingerprint"]

    def load(self) -> Encoded:
        """Every row in memory, as the `Encoded` that was written."""
        read = self.shards.read(np.arange(len(self)))
        return Encoded(read["input_ids"], read["token_type_ids"], read["lengths"], read["labels"])


def write_tokens(folder: str | Path, chunks: Iterable[Encoded], shard_rows: int = 65536,
                 meta: dict | None = None) -> PreparedTokens:
    """Write the rows of `chunks` (in order; one Encoded, or many for a split tokenized piece by piece) as the
    prepared folder `folder`, and open it. `meta`: what else the manifest records (the tokenizer, the sources)."""
    digest, largest, tokens, writer = SplitDigest(), 0, 0, None
    try:
        for chunk in chunks:
            if writer is None:
                fields = {"input_ids": Field("int32", (chunk.max_length,)),
                          "token_type_ids": Field("int32", (chunk.max_length,)), "lengths": Field("int32"),
                          "labels": Field(chunk.labels.dtype.str, chunk.labels.shape[1:])}
                writer = ShardWriter(folder, fields, columns=("lengths",), shard_rows=shard_rows,
                                     meta={**(meta or {}), "kind": KIND, "max_length": chunk.max_length})
            writer.add(input_ids=chunk.input_ids, token_type_ids=chunk.token_type_ids, lengths=chunk.lengths,
                       labels=chunk.labels)
            digest.update(chunk.input_ids, chunk.token_type_ids, chunk.lengths, chunk.labels)
            largest = max(largest, chunk.max_token_id)
            tokens += chunk.token_count
        if writer is None:
            raise ValueError("write_tokens got no rows")
        writer.meta.update(fingerprint=digest.hexdigest(), max_token_id=largest, token_count=tokens)
    except BaseException:
        if writer is not None:
            writer.abandon()
        raise
    writer.close()
    return open_tokens(folder)


def open_tokens(location: str | Path) -> PreparedTokens:
    """The prepared tokenized split at `location` (a path or an fsspec URL)."""
    return PreparedTokens(open_shards(location))
