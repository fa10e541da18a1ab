"""Data: synthetic tasks, the offline parallel corpus, local files and hub datasets.

``build_data(cfg.data, model_kind, seed, cache_dir)`` turns a ``conf/data/*.yaml`` into a
``SequenceData`` module; ``DATASETS`` lists the names ``data.name`` accepts.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from attnlab.data.module import SequenceData, Vocabulary
from attnlab.data.synthetic import N_SPECIAL, TASKS, synthetic_splits


def synthetic(cfg: DictConfig, seed: int, cache_dir: Path):
    sizes = {"train": cfg.train_size, "validation": cfg.val_size, "test": cfg.test_size}
    splits = synthetic_splits(cfg.name, cfg.vocab, cfg.min_len, cfg.max_len, sizes, cfg.get("seed", seed))
    return splits, Vocabulary(size=N_SPECIAL + cfg.vocab)


def translation(cfg: DictConfig, seed: int, cache_dir: Path):
    from attnlab.data.translation import translation_splits

    return translation_splits(cfg, cache_dir)


def text(cfg: DictConfig, seed: int, cache_dir: Path):
    from attnlab.data.text import text_splits

    return text_splits(cfg, cache_dir)


DATASETS = {**dict.fromkeys(TASKS, synthetic), "translation": translation, "text": text}


def build_data(cfg: DictConfig, model_kind: str, seed: int, cache_dir: Path) -> SequenceData:
    splits, vocab = DATASETS[cfg.name](cfg, seed, cache_dir)
    return SequenceData(splits, vocab, model_kind, cfg.batch_size, cfg.get("eval_batch_size"), cfg.num_workers, seed)


__all__ = ["DATASETS", "SequenceData", "Vocabulary", "build_data"]
