import os
from pathlib import Path

import pytest
import torch

# Caches inside the project (never $HOME) and no network, for every test.
ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("ATTNLAB_CACHE", ROOT / ".cache"))
for var, sub in {
    "HF_HOME": "huggingface",
    "WANDB_DIR": "wandb",
    "WANDB_CACHE_DIR": "wandb-cache",
    "WANDB_CONFIG_DIR": "wandb-config",
    "WANDB_DATA_DIR": "wandb-data",
    "MPLCONFIGDIR": "matplotlib",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
}.items():
    os.environ.setdefault(var, str(CACHE / sub))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
