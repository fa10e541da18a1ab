"""Synthetic sequence tasks that make sharp attention demands: copy, reverse, sort, recall.

Each example is a (src, tgt) pair of token ids, deterministic from the seed. Symbols are
ids ``N_SPECIAL .. N_SPECIAL + vocab - 1``; the ids below them are PAD, BOS, EOS, SEP.

* copy     tgt = src
* reverse  tgt = src reversed
* sort     tgt = src sorted
* recall   associative recall: src = k1 v1 k2 v2 … kn vn q with distinct keys, tgt = the
           value stored under key q (keys and values drawn from disjoint halves of the
           vocabulary). n runs over [min_len, max_len].
* lookup   recall with no use for positions: src = n pair tokens (k, v) with distinct keys k,
           then a query token q; tgt = the v paired with q. ``vocab`` keys, LOOKUP_VALUES
           values: K·V pair tokens and K query tokens. Finding the one pair among n is pure
           content matching, so with ``model.positions=none`` what changes with n is only
           how sharply attention can pick one key of n: the length-generalisation task.
"""

from __future__ import annotations

import numpy as np
from datasets import Dataset, DatasetDict

from attnlab.data.errors import DataError

PAD, BOS, EOS, SEP = 0, 1, 2, 3
N_SPECIAL = 4
SPLIT_OFFSET = {"train": 0, "validation": 1_000_003, "test": 2_000_003}


def copy_example(rng: np.random.Generator, vocab: int, length: int) -> tuple[list[int], list[int]]:
    src = rng.integers(N_SPECIAL, N_SPECIAL + vocab, size=length).tolist()
    return src, list(src)


def reverse_example(rng, vocab, length):
    src, _ = copy_example(rng, vocab, length)
    return src, src[::-1]


def sort_example(rng, vocab, length):
    src, _ = copy_example(rng, vocab, length)
    return src, sorted(src)


def recall_example(rng, vocab, length):
    half = vocab // 2
    keys = rng.choice(half, size=length, replace=False) + N_SPECIAL
    values = rng.integers(half, vocab, size=length) + N_SPECIAL
    query = rng.integers(length)
    src = [*np.stack([keys, values], axis=1).ravel().tolist(), int(keys[query])]
    return src, [int(values[query])]


LOOKUP_VALUES = 8


def lookup_example(rng, vocab, length):
    keys = rng.choice(vocab, size=length, replace=False)
    values = rng.integers(LOOKUP_VALUES, size=length)
    query = rng.integers(length)
    pairs = (N_SPECIAL + keys * LOOKUP_VALUES + values).tolist()
    return [*pairs, N_SPECIAL + vocab * LOOKUP_VALUES + int(keys[query])], [N_SPECIAL + int(values[query])]


TASKS = {"copy": copy_example, "reverse": reverse_example, "sort": sort_example, "recall": recall_example,
         "lookup": lookup_example}  # fmt: skip


def vocab_size(task: str, vocab: int) -> int:
    """Ids a task uses: the specials and its symbols (lookup: pair and query tokens)."""
    return N_SPECIAL + (vocab * LOOKUP_VALUES + vocab if task == "lookup" else vocab)


def check_sizes(task: str, vocab: int, min_len: int, max_len: int) -> None:
    if not 1 <= min_len <= max_len:
        raise DataError(f"data.min_len={min_len}, data.max_len={max_len}: need 1 <= min_len <= max_len")
    if task == "recall" and max_len > vocab // 2:
        raise DataError(
            f"data.max_len={max_len} pairs need as many distinct keys, but data.vocab={vocab} "
            f"gives {vocab // 2}; raise data.vocab to at least {2 * max_len}"
        )
    if task == "lookup" and max_len > vocab:
        raise DataError(
            f"data.max_len={max_len} pairs need as many distinct keys, but data.vocab={vocab} keys were "
            f"asked for; raise data.vocab to at least {max_len}"
        )


def synthetic_splits(
    task: str, vocab: int, min_len: int, max_len: int, sizes: dict[str, int], seed: int
) -> DatasetDict:
    """Build train/validation/test ``datasets.Dataset``s with columns src, tgt."""
    check_sizes(task, vocab, min_len, max_len)
    make = TASKS[task]
    splits = {}
    for split, size in sizes.items():
        rng = np.random.default_rng(seed + SPLIT_OFFSET[split])
        lengths = rng.integers(min_len, max_len + 1, size=size)
        pairs = [make(rng, vocab, int(length)) for length in lengths]
        splits[split] = Dataset.from_dict({"src": [p[0] for p in pairs], "tgt": [p[1] for p in pairs]})
    return DatasetDict(splits)
