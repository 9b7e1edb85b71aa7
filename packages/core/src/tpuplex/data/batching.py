"""Static-shape batching: the TPU rules (fixed shapes, few programs, exact evaluation) made defaults.

`Encoded` is a tokenized split. `Batcher` turns it into host batches whose shapes come from a small fixed set:
`[global_batch, L]` with L the smallest bucket length that holds every row of the batch. A training epoch takes
every example once, grouped by length (the default: almost every batch holds rows of one bucket, so little is
padding) or in plain shuffled order, as HF's Trainer draws them; when the examples do not divide into batches,
one batch is filled up with weight-0 rows.
Evaluation batches are padded with weight-0 rows too, so every real example is counted exactly once with weight
1, whatever the replica count.

The order depends only on (seed, epoch), so every backend and every machine sees the same batches. It is a
`Permutation` evaluated at the positions a batch needs, so an epoch over a split of any size is planned in constant
memory (with length buckets, the bucket of every row is needed once per epoch); a process reads only the rows of
the global batch it feeds.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from tpuplex.errors import ConfigError, DataError
from tpuplex.hosts import process_rows
from tpuplex.protocol import Batch
from tpuplex.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A tokenized split, right-padded to the tokenizer's max length.

    input_ids, token_type_ids: int32 [N, max_length]; lengths: int32 [N] real tokens per row (>= 1);
    labels: int32 [N] (class index), float32 [N] (regression), or int32 [N, max_length] (one per token).
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def max_length(self) -> int:
        return self.input_ids.shape[1]

    @property
    def max_token_id(self) -> int:
        return int(self.input_ids.max(initial=0))

    @property
    def token_count(self) -> int:
        """Real tokens in the split."""
        return int(self.lengths.sum())

    def rows(self, indices: np.ndarray, length: int) -> dict[str, np.ndarray]:
        """The model inputs and labels of rows `indices`, cut to `length` tokens."""
        return token_rows(self.input_ids[indices], self.token_type_ids[indices], self.lengths[indices],
                          self.labels[indices], length)

    def fingerprint(self) -> str:
        """A short hash of the tokens and labels: equal exactly when the split trains the same way."""
        digest = SplitDigest()
        digest.update(self.input_ids, self.token_type_ids, self.lengths, self.labels)
        return digest.hexdigest()


def token_rows(input_ids: np.ndarray, token_type_ids: np.ndarray, lengths: np.ndarray, labels: np.ndarray,
               length: int) -> dict[str, np.ndarray]:
    """A batch's model inputs from its rows (input_ids, token_type_ids [b, max_length], lengths [b], labels [b] or
    [b, max_length]), cut to `length` tokens: input_ids, token_type_ids, attention_mask [b, length] int32, labels."""
    return {
        "input_ids": np.ascontiguousarray(input_ids[:, :length], dtype=np.int32),
        "token_type_ids": np.ascontiguousarray(token_type_ids[:, :length], dtype=np.int32),
        "attention_mask": (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32),
        "labels": np.ascontiguousarray(labels[:, :length]) if labels.ndim == 2 else labels,
    }


class SplitDigest:
    """The fingerprint of a tokenized split, computed chunk by chunk (rows in order) as it is written or at once:
    a sha256 per array (input_ids, token_type_ids, lengths, labels), combined with their dtypes and row shapes."""

    def __init__(self):
        self._digests = [hashlib.sha256() for _ in range(4)]
        self._layout: list[str] = []
        self._rows = 0

    def update(self, input_ids: np.ndarray, token_type_ids: np.ndarray, lengths: np.ndarray,
               labels: np.ndarray) -> None:
        arrays = (input_ids, token_type_ids, lengths, labels)
        self._layout = [str((array.dtype.str, array.shape[1:])) for array in arrays]
        for digest, array in zip(self._digests, arrays, strict=True):
            digest.update(np.ascontiguousarray(array).tobytes())
        self._rows += len(lengths)

    def hexdigest(self) -> str:
        combined = hashlib.sha256(str((self._rows, self._layout)).encode())
        for digest in self._digests:
            combined.update(digest.digest())
        return combined.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class EvalBatch:
    """An evaluation batch and, per row, the index of its example in the split (-1 for padding rows)."""

    batch: Batch
    index: np.ndarray


class Permutation:
    """A seeded bijection of [0, n), evaluated at any positions without materialising it (`permutation[positions]`).

    A Feistel network (six rounds of a SplitMix64 mix keyed from `default_rng(key)`) permutes the smallest domain of
    2^(2h) >= n numbers; positions it maps past n are mapped again until they land inside (cycle walking, Black and
    Rogaway 2002), which keeps it a bijection of [0, n). grain and tf.data's `index_shuffle` shuffle a global index
    this way for the same reason: the order of a billion rows costs no memory.
    """

    ROUNDS = 6

    def __init__(self, n: int, key: Sequence[int]):
        self.n = n
        self.half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
        self.keys = np.random.default_rng(list(key)).integers(0, 2**63, size=self.ROUNDS, dtype=np.uint64)

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        """int64 [...]: the permuted value of each position (each in [0, n))."""
        values = self._encrypt(np.asarray(positions, np.uint64))
        outside = values >= self.n
        while outside.any():
            values[outside] = self._encrypt(values[outside])
            outside = values >= self.n
        return values.astype(np.int64)

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        half, mask = np.uint64(self.half), np.uint64((1 << self.half) - 1)
        left, right = values >> half, values & mask
        with np.errstate(over="ignore"):
            for key in self.keys:
                mixed = (right + key) * np.uint64(0x9E3779B97F4A7C15)
                mixed = (mixed ^ (mixed >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
                mixed = (mixed ^ (mixed >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
                left, right = right, left ^ ((mixed ^ (mixed >> np.uint64(31))) & mask)
        return (left << half) | right


def check_divisible(global_batch: int, replicas: int, field: str = "train.global_batch",
                    mesh: Mesh | None = None) -> None:
    """Raise a TpuplexError listing batch sizes that work when `global_batch` does not divide by `replicas` (the
    batch shards of `mesh` when given: its fsdp devices take rows of their own too, which the message says)."""
    if global_batch <= 0 or global_batch % replicas:
        lower = max(replicas, global_batch // replicas * replicas)
        options = sorted({lower, lower + replicas, 4 * replicas, 8 * replicas} - {global_batch})[:4]
        raise ConfigError(
            f"{field} = {global_batch} does not divide by the {_shards(replicas, mesh)}: use a multiple of "
            f"{replicas}, such as {', '.join(map(str, options))}"
        )


def check_micro_batches(global_batch: int, replicas: int, grad_accum: int, mesh: Mesh | None = None) -> None:
    """`check_divisible`, then a TpuplexError unless each replica's rows split into `grad_accum` equal micro-batches."""
    check_divisible(global_batch, replicas, mesh=mesh)
    per_replica = global_batch // replicas
    if per_replica % grad_accum:
        raise ConfigError(
            f"train.grad_accum = {grad_accum} does not divide the {per_replica} rows each of the "
            f"{_shards(replicas, mesh)} gets (train.global_batch = {global_batch}): use a grad_accum that divides "
            f"{per_replica}, or a global batch that is a multiple of {replicas * grad_accum}"
        )


def _shards(replicas: int, mesh: Mesh | None) -> str:
    """"8 replicas", or for a mesh with fsdp "8 batch shards (runtime.mesh data = 2 x fsdp = 4: each fsdp shard
    takes rows of its own)"."""
    if mesh is None or mesh.fsdp == 1:
        return f"{replicas} replicas"
    return (f"{replicas} batch shards (runtime.mesh data = {mesh.data} x fsdp = {mesh.fsdp}: each fsdp shard takes "
            "rows of its own)")


def fit_buckets(lengths: np.ndarray, max_length: int, count: int, multiple: int = 1) -> tuple[int, ...]:
    """At most `count` sequence lengths that minimise the padded tokens of examples with `lengths` (int [N], each
    <= max_length) when each is padded to the smallest length that holds it; the last holds the longest example.

    Every length is a multiple of `multiple` or `max_length`. Exact: dynamic programming over the candidate
    lengths (the examples' lengths rounded up), O(count * candidates^2) with at most max_length / multiple
    candidates. (A Batcher adds max_length itself, for evaluation examples longer than every training one.)
    """
    if count < 1:
        raise ConfigError(f"data.bucket_count = {count}: use 1 or more (or 0 to use data.buckets)")
    rounded = np.minimum(-(-np.asarray(lengths, np.int64) // multiple) * multiple, max_length)
    candidates = np.unique(rounded)
    # covered[i]: examples whose rounded length is at most candidates[i].
    covered = np.searchsorted(np.sort(rounded), candidates, side="right")
    size = len(candidates)
    # cost[k, i]: fewest padded slots for the examples up to candidates[i] with k + 1 lengths, the last candidates[i]
    # (reached from the previous length candidates[parent[k, i]]).
    cost = np.full((count, size), np.inf)
    parent = np.full((count, size), -1)
    cost[0] = candidates * covered
    for k in range(1, count):
        for i in range(1, size):
            options = cost[k - 1, :i] + candidates[i] * (covered[i] - covered[:i])
            parent[k, i] = int(options.argmin())
            cost[k, i] = options[parent[k, i]]
    k, i = int(cost[:, -1].argmin()), size - 1  # argmin: the fewest lengths among equally good sets
    chosen = [int(candidates[i])]
    while k > 0:
        i, k = int(parent[k, i]), k - 1
        chosen.append(int(candidates[i]))
    return tuple(sorted(chosen))


def bucket_lengths(buckets: Sequence[int], max_length: int) -> tuple[int, ...]:
    """The sorted set of allowed sequence lengths: the buckets below max_length, and max_length itself."""
    lengths = sorted({int(b) for b in buckets if 0 < b < max_length} | {max_length})
    return tuple(lengths)


def padding_efficiency(batches: Iterable[Batch]) -> float:
    """Real tokens / padded tokens of `batches` (real rows / rows when they hold no tokens); rows of weight 0 count
    as padding (a batch without "weight" has only real rows). 0.0 for no batches."""
    real = padded = 0
    for batch in batches:
        weight = np.asarray(batch.get("weight", 1)).reshape(-1)
        if "attention_mask" in batch:
            real += int(np.sum(batch["attention_mask"].sum(axis=1) * weight))
            padded += batch["attention_mask"].size
        else:
            real += int(np.count_nonzero(np.broadcast_to(weight, len(batch["labels"]))))
            padded += len(batch["labels"])
    return real / padded if padded else 0.0


class Batcher:
    """Seeded, static-shape batches over one encoded split.

    Args:
        data: the encoded split (or any split with `lengths`, `max_length`, `rows(indices, length)` and
            `fingerprint()`, such as an image split, whose rows are all of length 1, or a prepared split read
            from shards; `lengths` is read only when there is more than one bucket).
        global_batch: rows per batch, across all replicas.
        replicas: data-parallel replicas; `global_batch` must divide by it.
        buckets: allowed sequence lengths (max_length is always one); empty pads everything to max_length.
        seed: the data-order seed.
        group_by_length: training batches of one bucket each (fewer padded tokens), or of shuffled rows (the
            batches HF's Trainer draws: gradients over rows of every length).
        process: (index, count) of this process: a training batch's rows that other processes feed
            (`tpuplex.hosts.process_rows`) are not read, and hold zeros (weights stay global).
    """

    def __init__(self, data: Encoded, global_batch: int, replicas: int, buckets: Sequence[int] = (), seed: int = 0,
                 group_by_length: bool = True, process: tuple[int, int] = (0, 1)):
        check_divisible(global_batch, replicas)
        if len(data) == 0:
            raise DataError("the split is empty: check the data files (a header and no rows?)")
        self.data = data
        self.global_batch = global_batch
        self.seed = seed
        self.group_by_length = group_by_length
        self.process = process
        self.lengths = bucket_lengths(buckets, data.max_length)

    @functools.cached_property
    def _bucket(self) -> np.ndarray:
        """int [N]: each example's bucket, the smallest allowed length that holds it."""
        return np.searchsorted(np.asarray(self.lengths), self.data.lengths, side="left")

    @property
    def steps_per_epoch(self) -> int:
        """Training batches per epoch: ceil(examples / global_batch), in either order."""
        return -(-len(self.data) // self.global_batch)

    def train_batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The epoch's training batches in order, beginning at batch `start` (for resuming mid-epoch: the batches
        before it are neither built nor read).

        Every example once, each batch padded to the smallest bucket that holds its longest row; the one short
        batch (when the examples do not divide) is filled up with weight-0 rows. The examples are shuffled by
        `Permutation(N, (seed, epoch))`, then either cut into batches in that order or, with several buckets,
        grouped by length (`_length_groups`; the batches are shuffled by `default_rng([seed, epoch])`).
        """
        for rows, weight, length in self._train_plan(epoch, start):
            yield self._gather(rows, length, weight, own_rows=True)

    def _train_plan(self, epoch: int, start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """(rows, weight, length) of each training batch of `epoch` from batch `start` on, without reading data."""
        order = Permutation(len(self.data), (self.seed, epoch))
        if self.group_by_length and len(self.lengths) > 1:
            groups = self._length_groups(order[np.arange(len(self.data))])
            rng = np.random.default_rng([self.seed, epoch])
            plan: Iterable[np.ndarray] = [groups[position] for position in rng.permutation(len(groups))][start:]
        else:
            plan = (order[np.arange(begin, min(begin + self.global_batch, len(self.data)))]
                    for begin in range(start * self.global_batch, len(self.data), self.global_batch))
        for real in plan:
            rows, weight = self._filled(real)
            yield rows, weight, self.lengths[self._bucket[rows].max()] if len(self.lengths) > 1 else self.lengths[0]

    def _length_groups(self, order: np.ndarray) -> list[np.ndarray]:
        """`order` grouped by bucket (keeping its order) and cut into full batches of one bucket each; the
        buckets' remainders (fewer than a batch each) are cut together, in bucket order, into the last batches."""
        groups, remainders = [], []
        for bucket in range(len(self.lengths)):
            members = order[self._bucket[order] == bucket]
            full = len(members) // self.global_batch * self.global_batch
            groups += self._cut(members[:full])
            remainders.append(members[full:])
        return groups + self._cut(np.concatenate(remainders))

    def _cut(self, rows: np.ndarray) -> list[np.ndarray]:
        """`rows` in consecutive batches of global_batch, the last one shorter when they do not divide."""
        return [rows[begin : begin + self.global_batch] for begin in range(0, len(rows), self.global_batch)]

    def eval_batches(self) -> Iterator[EvalBatch]:
        """Every example once, in split order within each bucket; the last batch of a bucket is padded.

        Padding rows repeat the batch's first example (so no row is all padding) and carry weight 0 and index -1.
        Every process reads every row (the Trainer gathers labels and outputs of the whole batch).
        """
        for rows, weight, length in self._eval_plan():
            index = np.where(weight > 0, rows, -1).astype(np.int64)
            yield EvalBatch(self._gather(rows, length, weight, own_rows=False), index)

    def _eval_plan(self) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """(rows, weight, length) of each evaluation batch, without reading data."""
        for bucket, length in enumerate(self.lengths):
            members = (np.flatnonzero(self._bucket == bucket) if len(self.lengths) > 1 else
                       np.arange(len(self.data)))
            for begin in range(0, len(members), self.global_batch):
                rows, weight = self._filled(members[begin : begin + self.global_batch])
                yield rows, weight, length

    def padding_efficiency(self, train: bool = True) -> float:
        """Real tokens / padded tokens over one epoch of training batches, or over the evaluation batches (real
        rows / rows for splits of length-1 rows), computed from the batches' plan: no row is read."""
        if len(self.lengths) == 1:
            batches = self.steps_per_epoch if train else -(-len(self.data) // self.global_batch)
            return self.data.token_count / (batches * self.global_batch * self.lengths[0])
        real = padded = 0
        for rows, weight, length in (self._train_plan(0) if train else self._eval_plan()):
            real += int(np.dot(np.minimum(self.data.lengths[rows], length), weight))
            padded += len(rows) * length
        return real / padded

    def _filled(self, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`real` row indices filled up to global_batch by repeating the first (so no row is all padding), and
        their weights: 1 for real rows, 0 for the repeats."""
        pad = self.global_batch - len(real)
        rows = np.concatenate([real, np.full(pad, real[0])])
        return rows, np.concatenate([np.ones(len(real), np.float32), np.zeros(pad, np.float32)])

    def _gather(self, rows: np.ndarray, length: int, weight: np.ndarray, own_rows: bool) -> Batch:
        index, count = self.process
        if not own_rows or count == 1:
            return {**self.data.rows(rows, length), "weight": weight}
        mine = process_rows(len(rows), index, count)
        batch = {}
        for key, values in self.data.rows(rows[mine], length).items():
            batch[key] = np.zeros((len(rows), *values.shape[1:]), values.dtype)
            batch[key][mine] = values
        return {**batch, "weight": weight}
