"""Prepared corpora and tokenizers, cached once per data config under the project cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from datasets import DatasetDict, load_from_disk
from omegaconf import DictConfig, OmegaConf

from attnlab.data.module import Vocabulary
from attnlab.data.synthetic import BOS, EOS, PAD, SEP

SPECIAL_TOKENS = ["[PAD]", "[BOS]", "[EOS]", "[SEP]"]  # ids 0..3, as in attnlab.data.synthetic
assert list(range(len(SPECIAL_TOKENS))) == [PAD, BOS, EOS, SEP]

# Keys that do not change what is prepared (batching, workers, how BLEU decodes).
NOT_DATA = ("batch_size", "eval_batch_size", "max_tokens", "num_workers", "bleu")


def fingerprint(cfg: DictConfig) -> str:
    relevant = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in NOT_DATA}
    return hashlib.sha1(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:12]


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE with attnlab's special ids (HF tokenizers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def cached_splits(cfg: DictConfig, cache_dir: Path, kind: str, prepare: Callable) -> tuple[DatasetDict, Vocabulary]:
    """Load ``cache_dir/kind/<fingerprint>``, running ``prepare(cfg) -> (splits, tokenizer)`` once.

    Preparation writes to a private folder that is renamed into place, so parallel sweep
    jobs or DDP ranks preparing the same data never see half-written files.
    """
    from tokenizers import Tokenizer

    out_dir = Path(cache_dir) / kind / fingerprint(cfg)
    if not (out_dir / "dataset").exists():
        splits, tokenizer = prepare(cfg)
        staging = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
        staging.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(staging / "tokenizer.json"))
        splits.save_to_disk(str(staging / "dataset"))
        try:
            staging.rename(out_dir)
        except OSError:  # another process got there first
            shutil.rmtree(staging, ignore_errors=True)
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    splits = load_from_disk(str(out_dir / "dataset"))
    vocab = Vocabulary(size=tokenizer.get_vocab_size(), decode=lambda ids: tokenizer.decode(ids).strip())
    return splits, vocab
