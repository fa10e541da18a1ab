"""Where corpora come from — local files or the Hugging Face hub — and their fixed splits."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset
from omegaconf import DictConfig

SPLITS = ("train", "validation", "test")
BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".tsv": "csv"}


def load_files(files: DictConfig, needed: str, builder: str | None = None) -> Dataset | DatasetDict:
    """``data.files.{train,validation,test}`` through ``datasets.load_dataset``; train is required.

    ``needed`` completes the error when no train file is given (what the file should hold);
    ``builder`` forces a loader ("text" reads any file as lines), else the suffix picks it.
    """
    paths = {split: str(path) for split, path in files.items() if path}
    if "train" not in paths:
        raise ValueError(f"data.source=files needs data.files.train=<{needed}> (validation, test optional)")
    for split, path in paths.items():
        if not Path(path).exists():
            raise FileNotFoundError(f"data.files.{split}={path!r} does not exist")
    suffix = Path(paths["train"]).suffix.lower()
    builder = builder or BUILDERS.get(suffix)
    if builder is None:
        raise ValueError(f"data.files: unsupported file type {suffix!r}; use one of {', '.join(BUILDERS)}")
    loaded = load_dataset(builder, data_files=paths, **({"delimiter": "\t"} if suffix == ".tsv" else {}))
    return loaded if len(loaded) > 1 else loaded["train"]


def load_hub(hub: DictConfig, offline_instead: str) -> DatasetDict:
    try:
        return load_dataset(hub.name, hub.subset)
    except Exception as error:  # offline, unknown name, no access: say which and how to fix
        raise RuntimeError(
            f"could not load hub dataset data.hub.name={hub.name!r} subset={hub.subset!r}: {error}. "
            f"It needs the network (unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE); offline, use {offline_instead}."
        ) from error


def fixed_splits(rows: Dataset | DatasetDict, cfg: DictConfig) -> DatasetDict:
    """Keep the splits given; carve the missing validation/test ones off train with a fixed seed."""
    given = dict(rows) if isinstance(rows, DatasetDict) else {"train": rows}
    missing = {split: size for split, size in (("validation", cfg.val_size), ("test", cfg.test_size))
               if split not in given}  # fmt: skip
    train = given["train"]
    if sum(missing.values()) >= len(train):
        raise ValueError(
            f"data.val_size + data.test_size = {sum(missing.values())} leaves no training rows of {len(train)}"
        )
    if missing:
        shuffled, start = train.shuffle(seed=cfg.split_seed), 0
        for split, size in missing.items():
            given[split], start = shuffled.select(range(start, start + size)), start + size
        given["train"] = shuffled.select(range(start, len(train)))
    return DatasetDict({split: given[split] for split in SPLITS})
