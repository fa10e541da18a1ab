"""One LightningDataModule for every corpus: (src, tgt) id pairs in a ``datasets.DatasetDict``.

Batches come in the layout the model needs:

* encoder–decoder: ``src`` (B, m) + ``src_mask``; ``tgt_in`` = BOS + tgt, ``tgt_out`` =
  tgt + EOS (padding = -100, ignored by the loss) + ``tgt_mask``;
* decoder-only LM: ``tokens`` = src + SEP + tgt (BOS + tgt when src is empty), ``targets``
  the next token where it is part of tgt + EOS, -100 elsewhere; ``mask``;
* both: ``n_tokens``, the number of real (unpadded) tokens, as a Python int.

Training batches come from an endless, deterministic stream: batch b is a slice of the
permutation seeded by (seed, b // batches_per_pass). A resumed run starts the stream at
the batch it stopped at, so it sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import lightning as L
import torch
from datasets import DatasetDict
from torch.utils.data import DataLoader, Sampler

from attnlab.data.errors import DataError
from attnlab.data.synthetic import BOS, EOS, PAD, SEP

IGNORE = -100


@dataclass
class Vocabulary:
    """What the model and decoding need of a vocabulary (padding is PAD, masked by the collators)."""

    size: int
    bos: int = BOS
    eos: int = EOS
    decode: Callable[[list[int]], str] | None = None  # ids -> text, for BLEU


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=torch.long)


def collate_seq2seq(examples: list[dict]) -> dict:
    src = pad([ex["src"] for ex in examples], PAD)
    tgt_in = pad([[BOS, *ex["tgt"]] for ex in examples], PAD)
    tgt_out = pad([[*ex["tgt"], EOS] for ex in examples], IGNORE)
    batch = {
        "src": src,
        "src_mask": src != PAD,
        "tgt_in": tgt_in,
        "tgt_out": tgt_out,
        "tgt_mask": tgt_out != IGNORE,
        "n_tokens": sum(len(ex["src"]) + len(ex["tgt"]) + 1 for ex in examples),  # real ones, for perf/
    }
    if "tgt_text" in examples[0]:  # a corpus's raw target sentences: the references BLEU scores against
        batch["tgt_text"] = [ex["tgt_text"] for ex in examples]
    return batch


def collate_lm(examples: list[dict]) -> dict:
    tokens, targets = [], []
    for ex in examples:
        prefix = [*ex["src"], SEP] if ex["src"] else [BOS]
        tokens.append(prefix + ex["tgt"])
        targets.append([IGNORE] * (len(prefix) - 1) + ex["tgt"] + [EOS])
    lengths = torch.tensor([len(row) for row in tokens])
    tokens = pad(tokens, PAD)
    mask = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return {"tokens": tokens, "targets": pad(targets, IGNORE), "mask": mask, "n_tokens": int(lengths.sum())}


COLLATE = {"transformer": collate_seq2seq, "lm": collate_lm}


class StreamBatchSampler(Sampler[list[int]]):
    """Endless shuffled batches, a pure function of (seed, batch number, rank).

    Each global batch of ``batch_size`` examples is split between the DDP ranks, so the
    sampler shards by itself (the Trainer runs with ``use_distributed_sampler=False``).
    """

    def __init__(self, n: int, batch_size: int, seed: int, start: int = 0, rank: int = 0, world_size: int = 1):
        if batch_size > n:
            raise DataError(f"data.batch_size={batch_size} exceeds the {n} training examples")
        if batch_size % world_size:
            raise DataError(f"data.batch_size={batch_size} must divide by the {world_size} DDP processes")
        self.n, self.batch_size, self.seed, self.start = n, batch_size, seed, start
        self.rank, self.world_size = rank, world_size
        self.per_pass = n // batch_size  # the last partial batch of each pass is dropped

    def __iter__(self) -> Iterator[list[int]]:
        batch, order, order_pass = self.start, None, -1
        while True:
            pass_number, slot = divmod(batch, self.per_pass)
            if pass_number != order_pass:
                generator = torch.Generator().manual_seed(self.seed * 100_003 + pass_number)
                order, order_pass = torch.randperm(self.n, generator=generator), pass_number
            indices = order[slot * self.batch_size : (slot + 1) * self.batch_size]
            yield indices[self.rank :: self.world_size].tolist()
            batch += 1


def example_tokens(model_kind: str, src: list[int], tgt: list[int]) -> int:
    """What one example adds to a padded batch: the longer side of a seq2seq pair (the target
    with its BOS/EOS), or the whole LM sequence."""
    return max(len(src), len(tgt) + 1) if model_kind == "transformer" else len(src) + len(tgt) + 1


class TokenBatchSampler(StreamBatchSampler):
    """Endless batches of about ``max_tokens`` tokens each (``data.max_tokens``), as in the paper
    (§5.1: batches of ≈25k source and 25k target tokens) and fairseq.

    Each pass shuffles the examples, sorts them by length (ties stay shuffled), cuts them into
    batches whose padded size, examples × longest, is at most ``max_tokens``, and shuffles the
    batches. Batch b is still a pure function of (seed, b): a resumed run continues the stream.
    """

    def __init__(
        self, lengths: list[int], max_tokens: int, seed: int, start: int = 0, rank: int = 0, world_size: int = 1
    ):
        longest = max(lengths)
        if longest * world_size > max_tokens:
            raise DataError(
                f"data.max_tokens={max_tokens} cannot hold the longest training example ({longest} tokens) "
                f"on each of {world_size} processes; raise data.max_tokens to at least {longest * world_size}"
            )
        self.lengths, self.max_tokens, self.seed, self.start = torch.tensor(lengths), max_tokens, seed, start
        self.rank, self.world_size = rank, world_size
        self.passes: dict[int, list[torch.Tensor]] = {}

    def batches_of_pass(self, pass_number: int) -> list[torch.Tensor]:
        if pass_number not in self.passes:
            self.passes = {pass_number: self.cut(pass_number)}  # one pass kept at a time
        return self.passes[pass_number]

    def cut(self, pass_number: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + pass_number)
        order = torch.randperm(len(self.lengths), generator=generator)
        order = order[torch.argsort(self.lengths[order], stable=True)]
        batches, first, longest = [], 0, 0
        for position, length in enumerate(self.lengths[order].tolist()):
            longest = max(longest, length)
            if (position + 1 - first) * longest > self.max_tokens:
                batches.append(order[first:position])
                first, longest = position, length
        batches.append(order[first:])
        # A batch needs an example for every process.
        batches = [batch for batch in batches if len(batch) >= self.world_size]
        shuffle = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[i] for i in shuffle]

    def __iter__(self) -> Iterator[list[int]]:
        pass_number, slot = 0, self.start
        while slot >= len(self.batches_of_pass(pass_number)):  # where batch `start` lies
            slot -= len(self.batches_of_pass(pass_number))
            pass_number += 1
        while True:
            batches = self.batches_of_pass(pass_number)
            for batch in batches[slot:]:
                yield batch[self.rank :: self.world_size].tolist()
            pass_number, slot = pass_number + 1, 0


class SequenceData(L.LightningDataModule):
    """Serves a DatasetDict of (src, tgt) pairs to either model kind."""

    def __init__(
        self,
        splits: DatasetDict,
        vocab: Vocabulary,
        model_kind: str,
        batch_size: int,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        max_tokens: int | None = None,
    ):
        super().__init__()
        self.splits, self.vocab, self.seed = splits, vocab, seed
        self.model_kind, self.collate = model_kind, COLLATE[model_kind]
        self.max_tokens = max_tokens
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        # One stream batch per optimizer step and accumulation; on resume, global_step says
        # how many were consumed.
        start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
        rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
        train = self.splits["train"]
        if self.max_tokens:
            lengths = [example_tokens(self.model_kind, *pair) for pair in zip(train["src"], train["tgt"], strict=True)]
            sampler = TokenBatchSampler(lengths, self.max_tokens, self.seed, start, rank, world)
        else:
            sampler = StreamBatchSampler(len(train), self.batch_size, self.seed, start, rank, world)
        return self.loader(train, batch_sampler=sampler)

    def eval_loader(self, split: str) -> DataLoader:
        dataset = self.splits[split]
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:  # each rank evaluates its own shard
            dataset = dataset.shard(trainer.world_size, trainer.global_rank, contiguous=True)
        return self.loader(dataset, batch_size=self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self.eval_loader("test")

    def loader(self, dataset, **kwargs) -> DataLoader:
        return DataLoader(
            dataset.with_format(None),
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            **kwargs,
        )
