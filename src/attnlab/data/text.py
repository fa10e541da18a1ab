"""Causal-LM text: local text files (one document or line per row) or a hub dataset.

Rows are tokenised with a BPE trained on the training split, concatenated with EOS
between rows and cut into blocks of ``data.block_size`` tokens; each block is one
example with an empty ``src`` (the LM reads BOS + block).
"""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, DatasetDict
from omegaconf import DictConfig

from attnlab.data.cache import cached_splits, train_tokenizer
from attnlab.data.errors import DataError
from attnlab.data.module import Vocabulary
from attnlab.data.sources import fixed_splits, from_source, load_files, load_hub
from attnlab.data.synthetic import EOS


def texts_from_files(cfg: DictConfig) -> Dataset | DatasetDict:
    return load_files(cfg.files, needed="a text file, one document or line per row", builder="text")


def texts_from_hub(cfg: DictConfig) -> DatasetDict:
    loaded = load_hub(cfg.hub, offline_instead="data.source=files")
    return loaded.rename_column(cfg.hub.text_column, "text") if cfg.hub.text_column != "text" else loaded


SOURCES = {"files": texts_from_files, "hub": texts_from_hub}


def blocks(rows: Dataset, tokenizer, block_size: int) -> Dataset:
    stream: list[int] = []
    for encoding in tokenizer.encode_batch([text for text in rows["text"] if text.strip()]):
        stream.extend([*encoding.ids, EOS])
    chunks = [stream[start : start + block_size] for start in range(0, len(stream) - block_size + 1, block_size)]
    return Dataset.from_dict({"src": [[] for _ in chunks], "tgt": chunks})


def prepare(cfg: DictConfig):
    texts = from_source(cfg, SOURCES)
    splits = fixed_splits(texts, cfg)
    tokenizer = train_tokenizer((row["text"] for row in splits["train"]), cfg.vocab_size)
    cut = DatasetDict({name: blocks(rows, tokenizer, cfg.block_size) for name, rows in splits.items()})
    for name, rows in cut.items():
        if len(rows) == 0:
            raise DataError(
                f"data=text: the {name} split ({len(splits[name])} rows) has fewer than data.block_size="
                f"{cfg.block_size} tokens, so it makes no example; lower data.block_size or give it more text"
            )
    return cut, tokenizer


def text_splits(cfg: DictConfig, cache_dir: Path) -> tuple[DatasetDict, Vocabulary]:
    return cached_splits(cfg, cache_dir, "text", prepare)
