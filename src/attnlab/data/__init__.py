"""Data: synthetic tasks, the offline parallel corpus, local files and hub datasets.

``build_data(cfg.data, model_kind, seed, cache_dir)`` turns a ``conf/data/*.yaml`` into a
``SequenceData`` module; ``DATASETS`` lists the names ``data.name`` accepts.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from attnlab.data.errors import DataError
from attnlab.data.module import SequenceData, Vocabulary
from attnlab.data.synthetic import TASKS, synthetic_splits, vocab_size
from attnlab.data.text import SOURCES as TEXT_SOURCES
from attnlab.data.text import text_splits
from attnlab.data.translation import SOURCES as TRANSLATION_SOURCES
from attnlab.data.translation import translation_splits


def synthetic(cfg: DictConfig, seed: int, cache_dir: Path):
    sizes = {"train": cfg.train_size, "validation": cfg.val_size, "test": cfg.test_size}
    data_seed = cfg.get("seed")
    splits = synthetic_splits(
        cfg.name, cfg.vocab, cfg.min_len, cfg.max_len, sizes, seed if data_seed is None else data_seed
    )
    return splits, Vocabulary(size=vocab_size(cfg.name, cfg.vocab))


def translation(cfg: DictConfig, seed: int, cache_dir: Path):
    return translation_splits(cfg, cache_dir)


def text(cfg: DictConfig, seed: int, cache_dir: Path):
    return text_splits(cfg, cache_dir)


DATASETS = {**dict.fromkeys(TASKS, synthetic), "translation": translation, "text": text}
# Where real corpora come from: the values data.source accepts, per data.name.
SOURCES = {"translation": TRANSLATION_SOURCES, "text": TEXT_SOURCES}


def build_data(cfg: DictConfig, model_kind: str, seed: int, cache_dir: Path) -> SequenceData:
    splits, vocab = DATASETS[cfg.name](cfg, seed, cache_dir)
    check_sizes(splits, cfg)
    return SequenceData(
        splits, vocab, model_kind, cfg.batch_size, eval_batch_size=cfg.get("eval_batch_size"),
        num_workers=cfg.num_workers, seed=seed, max_tokens=cfg.get("max_tokens"),
    )  # fmt: skip


def check_sizes(splits, cfg: DictConfig) -> None:
    """Enough examples for one batch, and none of the splits empty: said before training."""
    for split, rows in splits.items():
        if len(rows) == 0:
            raise DataError(f"data={cfg.name}: the {split} split is empty after preparation; give it more data")
    if not cfg.get("max_tokens") and len(splits["train"]) < cfg.batch_size:
        raise DataError(
            f"data.batch_size={cfg.batch_size} exceeds the {len(splits['train'])} training examples of "
            f"data={cfg.name}; lower data.batch_size or give more data"
        )


__all__ = ["DATASETS", "SOURCES", "SequenceData", "Vocabulary", "build_data"]
