"""Where corpora come from — local files or the Hugging Face hub — and their fixed splits."""

from __future__ import annotations

import codecs
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset
from omegaconf import DictConfig

from attnlab.data.errors import DataError, MissingDataError

SPLITS = ("train", "validation", "test")
BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".tsv": "csv"}


def check_text_file(key: str, path: Path, needed: str) -> None:
    """Not empty and valid UTF-8; else an error naming the file (and the byte offset)."""
    if not path.is_file():
        raise MissingDataError(f"{key}={str(path)!r} does not exist (or is not a file)")
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, has_text = 0, False
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            try:
                has_text = bool(decoder.decode(chunk).strip()) or has_text
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{key}={str(path)!r} is not UTF-8 text: undecodable byte {chunk[error.start]:#04x} at byte "
                    f"offset {offset + error.start}; convert it (e.g. iconv -f latin1 -t utf-8) and try again"
                ) from None
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"{key}={str(path)!r} is not UTF-8 text: it ends inside a multi-byte character") from None
    if not has_text:
        raise DataError(f"{key}={str(path)!r} is empty; it should hold {needed}")


def load_files(
    files: DictConfig, needed: str, builder: str | None = None, columns: tuple[str, ...] = ()
) -> Dataset | DatasetDict:
    """``data.files.{train,validation,test}`` through ``datasets.load_dataset``; train is required.

    ``needed`` completes the errors (what the file should hold); ``builder`` forces a loader
    ("text" reads any file as lines), else the suffix picks it; ``columns`` are required.
    Every file is checked first: it exists, is not empty, and is UTF-8.
    """
    paths = {split: str(path) for split, path in files.items() if path}
    if "train" not in paths:
        raise DataError(f"data.source=files needs data.files.train=<{needed}> (validation, test optional)")
    for split, path in paths.items():
        check_text_file(f"data.files.{split}", Path(path), needed)
    suffix = Path(paths["train"]).suffix.lower()
    builder = builder or BUILDERS.get(suffix)
    if builder is None:
        raise DataError(f"data.files: unsupported file type {suffix!r}; use one of {', '.join(BUILDERS)}")
    try:
        loaded = load_dataset(builder, data_files=paths, **({"delimiter": "\t"} if suffix == ".tsv" else {}))
    except Exception as error:  # malformed JSON/CSV: say which files and what was expected
        raise DataError(
            f"data.files: could not read {', '.join(paths.values())} as {builder} ({needed}): {error}"
        ) from error
    for split, rows in loaded.items():
        missing = [column for column in columns if column not in rows.column_names]
        if missing:
            raise DataError(
                f"data.files.{split}={paths[split]!r} has columns {rows.column_names} but needs "
                f"{', '.join(columns)} (missing: {', '.join(missing)}); rename its fields to {', '.join(columns)}"
            )
    return loaded if len(loaded) > 1 else loaded["train"]


def from_source(cfg: DictConfig, sources: dict):
    """Rows from ``sources[data.source]`` (each corpus lists where it can come from)."""
    if cfg.source not in sources:
        raise DataError(f"data.source={cfg.source!r} is not valid; accepted values: {', '.join(sources)}")
    return sources[cfg.source](cfg)


def load_hub(hub: DictConfig, offline_instead: str) -> DatasetDict:
    try:
        return load_dataset(hub.name, hub.subset)
    except Exception as error:  # offline, unknown name, no access: say which and how to fix
        raise DataError(
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
        raise DataError(
            f"data.val_size + data.test_size = {sum(missing.values())} leaves no training rows of {len(train)}"
        )
    if missing:
        shuffled, start = train.shuffle(seed=cfg.split_seed), 0
        for split, size in missing.items():
            given[split], start = shuffled.select(range(start, start + size)), start + size
        given["train"] = shuffled.select(range(start, len(train)))
    return DatasetDict({split: given[split] for split in SPLITS})
