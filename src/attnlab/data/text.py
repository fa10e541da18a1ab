"""Causal-LM text: local text files (one document or line per row) or a hub dataset.

Rows are tokenised with a BPE trained on the training split, concatenated with EOS
between rows and cut into blocks of ``data.block_size`` tokens; each block is one
example with an empty ``src`` (the LM reads BOS + block).
"""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset
from omegaconf import DictConfig

from attnlab.data.cache import cached_splits, train_tokenizer
from attnlab.data.module import Vocabulary
from attnlab.data.synthetic import EOS
from attnlab.data.translation import fixed_splits


def read_texts(cfg: DictConfig) -> Dataset | DatasetDict:
    if cfg.source == "files":
        paths = {split: str(path) for split, path in cfg.files.items() if path}
        if "train" not in paths:
            raise ValueError("data=text needs a corpus: data.files.train=<path to a .txt file> (or data.source=hub)")
        for split, path in paths.items():
            if not Path(path).exists():
                raise FileNotFoundError(f"data.files.{split}={path!r} does not exist")
        loaded = load_dataset("text", data_files=paths)
        return loaded if len(loaded) == 3 else loaded["train"]
    if cfg.source == "hub":
        try:
            loaded = load_dataset(cfg.hub.name, cfg.hub.subset)
        except Exception as error:
            raise RuntimeError(
                f"could not load hub dataset data.hub.name={cfg.hub.name!r}: {error}. It needs the network "
                "(unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE); offline, use data.source=files."
            ) from error
        return loaded.rename_column(cfg.hub.text_column, "text") if cfg.hub.text_column != "text" else loaded
    raise ValueError(f"data.source={cfg.source!r} is not valid for data=text; accepted values: files, hub")


def blocks(rows: Dataset, tokenizer, block_size: int) -> Dataset:
    stream: list[int] = []
    for encoding in tokenizer.encode_batch([text for text in rows["text"] if text.strip()]):
        stream.extend([*encoding.ids, EOS])
    chunks = [stream[start : start + block_size] for start in range(0, len(stream) - block_size + 1, block_size)]
    return Dataset.from_dict({"src": [[] for _ in chunks], "tgt": chunks})


def prepare(cfg: DictConfig):
    texts = read_texts(cfg)
    splits = fixed_splits(texts, cfg)
    tokenizer = train_tokenizer((row["text"] for row in splits["train"]), cfg.vocab_size)
    return DatasetDict({name: blocks(rows, tokenizer, cfg.block_size) for name, rows in splits.items()}), tokenizer


def text_splits(cfg: DictConfig, cache_dir: Path) -> tuple[DatasetDict, Vocabulary]:
    return cached_splits(cfg, cache_dir, "text", prepare)
