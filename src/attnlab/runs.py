"""Reading what a run left on disk: its config and its local metrics."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from omegaconf import OmegaConf

MAPS_DIR = "attention_maps"  # in a run dir: the attention maps' PNGs (attnlab.probes.maps)


def flatten(config: dict, prefix: str = "") -> dict:
    """{"attention": {"scale": "none"}} → {"attention.scale": "none"} (as W&B shows config keys)."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_config(run_dir: str | Path) -> dict:
    return OmegaConf.to_container(OmegaConf.load(Path(run_dir) / "config.yaml"))


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Rows of csv/version_*/metrics.csv in order (a resumed run adds a version).

    Each row holds ``step`` and the metrics logged at it; empty cells are dropped.
    """
    rows = []
    versions = sorted((Path(run_dir) / "csv").glob("version_*"), key=lambda path: int(path.name.split("_")[1]))
    for version in versions:
        path = version / "metrics.csv"
        if not path.exists():
            continue
        with path.open(newline="") as file:
            for row in csv.DictReader(file):
                rows.append({key: float(value) for key, value in row.items() if value not in ("", None)})
    return rows


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric; a step logged twice (resume overlap) keeps the later value."""
    by_step = {row["step"]: row[key] for row in rows if key in row and not math.isnan(row[key])}
    steps = sorted(by_step)
    return steps, [by_step[step] for step in steps]
