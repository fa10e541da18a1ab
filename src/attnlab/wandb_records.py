"""Read an offline W&B run (``run-*.wandb``) with wandb's own record format, no network.

The file is a LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of
chunks: crc32 uint32, length uint16, type uint8, data) whose records are
``wandb.proto.wandb_internal_pb2.Record`` messages. wandb ≥ 0.31 no longer ships a
Python reader, so this is one.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from wandb.proto import wandb_internal_pb2

HEADER = struct.Struct("<4sHB")  # ident, magic, version
CHUNK = struct.Struct("<IHB")  # crc32, length, type
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def chunks(raw: bytes) -> Iterator[tuple[int, bytes]]:
    offset = HEADER.size
    while offset + CHUNK.size <= len(raw):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < CHUNK.size:  # block trailer: zero padding
            offset += left_in_block
            continue
        checksum, length, kind = CHUNK.unpack_from(raw, offset)
        data = raw[offset + CHUNK.size : offset + CHUNK.size + length]
        if kind == 0 or len(data) < length:  # preallocated tail, or a run still writing
            return
        if zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != checksum:
            raise ValueError(f"corrupt W&B record at byte {offset}")
        yield kind, data
        offset += CHUNK.size + length


def records(path: str | Path) -> Iterator[wandb_internal_pb2.Record]:
    raw = Path(path).read_bytes()
    ident, _, _ = HEADER.unpack_from(raw)
    if ident != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    parts: list[bytes] = []
    for kind, data in chunks(raw):
        parts = [data] if kind in (FULL, FIRST) else [*parts, data]
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            yield record


def history(path: str | Path) -> list[dict]:
    """Every ``wandb.log`` row of the run, as {key: value}."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def updated(path: str | Path, updates_of) -> dict:
    """{key: value} from the items ``updates_of(record)`` gives, later updates winning."""
    values = {}
    for record in records(path):
        for item in updates_of(record):
            values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values


def config(path: str | Path) -> dict:
    """The run's config as logged ({key: value}, later updates win)."""

    def updates_of(record):
        kind = record.WhichOneof("record_type")
        return record.run.config.update if kind == "run" else record.config.update if kind == "config" else []

    values = updated(path, updates_of)
    values.pop("_wandb", None)
    return values


def summary(path: str | Path) -> dict:
    """The run's summary as written (``run.summary[key] = …``; later updates win)."""
    return updated(path, lambda record: record.summary.update if record.WhichOneof("record_type") == "summary" else [])


def run_info(path: str | Path) -> dict:
    """Id, group, tags and job type of the run."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            run = record.run
            return {
                "id": run.run_id,
                "group": run.run_group,
                "tags": list(run.tags),
                "job_type": run.job_type,
            }
    raise ValueError(f"{path} holds no run record")
