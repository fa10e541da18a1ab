"""Throughput accounting: ``perf/tokens_per_s``, and ``perf/mfu`` from the model's FLOPs per
training step over the device's peak.

FLOPs of one training step (forward + backward ≈ 3 × forward; Kaplan et al. 2020, PaLM
appendix B): 6 FLOPs per weight of every matrix multiply per token, plus, per attention
layer, 6·h·(d_k + d_v) per (query, key) pair for QKᵀ and the weighted sum of V. MFU is
the achieved rate over the device's dense peak for the run's precision, where known.
"""

from __future__ import annotations

import time
import weakref

import lightning as L
import torch
from torch import nn

from attnlab.attention import MultiHeadAttention

# Dense peak FLOP/s by device name fragment: (bf16/fp16, tf32, fp32 without tensor cores), from
# the vendors' datasheets. More specific fragments first: "H100 PCIe" before "H100".
PEAK_FLOPS = {
    "H200 NVL": (835e12, 418e12, 60e12),
    "H200": (989.4e12, 494.7e12, 67e12),  # SXM
    "H100 PCIe": (756.5e12, 378e12, 51e12),
    "H100 NVL": (835e12, 418e12, 60e12),
    "H100": (989.4e12, 494.7e12, 67e12),  # SXM ("H100 80GB HBM3")
    "A100": (312e12, 156e12, 19.5e12),  # SXM and PCIe alike
    "L40S": (362.05e12, 183e12, 91.6e12),
    "A10G": (70e12, 35e12, 31.2e12),
}


def peak_for(name: str, precision: str, tf32: bool) -> float | None:
    """The dense peak of the device called ``name`` for a run at ``precision`` (Lightning's
    string), with float32 matmuls on TF32 tensor cores or not; None for an unknown device."""
    for fragment, (half, tf32_peak, fp32) in PEAK_FLOPS.items():
        if fragment in name:
            if "16" in str(precision):
                return half
            return tf32_peak if tf32 else fp32
    return None


def peak_flops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda":
        return None
    tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    return peak_for(torch.cuda.get_device_name(device), precision, tf32)


def matmul_weights(model: nn.Module) -> int:
    """Weights that multiply every token: all Linear layers (the tied output head included)."""
    return sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))


_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def flop_shape(model: nn.Module) -> tuple[int, dict[str, int]]:
    """(matmul weights, {attention layer name: 6·h·(d_k + d_v)}): fixed for a model, so walked
    once, not on every step that counts FLOPs."""
    if model not in _SHAPES:
        layers = {m.name: 6 * m.n_heads * (m.d_k + m.d_v) for m in model.modules() if isinstance(m, MultiHeadAttention)}
        _SHAPES[model] = (matmul_weights(model), layers)
    return _SHAPES[model]


def step_flops(model: nn.Module, tokens: int, pairs: dict[str, int]) -> float:
    """Training FLOPs of one step: ``tokens`` through the matmuls, ``pairs[layer name]``
    (query, key) pairs through each attention layer."""
    weights, layers = flop_shape(model)
    return 6 * weights * tokens + sum(per_pair * pairs[name] for name, per_pair in layers.items())


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether Lightning writes this step's metrics to the loggers (every ``log_every_n_steps``).
    Values logged on other steps are dropped, and each ``self.log`` call costs about a
    millisecond of Lightning bookkeeping on a CPU: log only on these steps."""
    return trainer._logger_connector.should_update_logs


class Throughput(L.Callback):
    """Logs perf/tokens_per_s, and perf/mfu on GPUs of known peak, over the steps since the last log.

    A step is timed from the previous step's end: data loading is included, and on a GPU
    the host's run-ahead evens out over steps without a sync here. The first step after
    the start or a validation is timed from its own start. n_tokens is counted on the CPU.
    """

    def __init__(self):
        self.step_started = self.step_ended = self.peak = None
        self.tokens = self.seconds = self.flops = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.peak = peak_flops(pl_module.device, trainer.precision)  # None off known GPUs

    def on_train_batch_start(self, trainer, pl_module, batch: dict, batch_idx: int) -> None:
        self.step_started = time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.step_ended = None

    def on_validation_start(self, trainer, pl_module) -> None:
        self.step_ended = None  # validation time is not the next step's

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: dict, batch_idx: int) -> None:
        now = time.perf_counter()
        self.seconds += now - (self.step_ended if self.step_ended is not None else self.step_started)
        self.step_ended = now
        self.tokens += batch["n_tokens"] * trainer.world_size
        if self.peak:
            self.flops += pl_module.model.step_flops(batch)
        if logs_this_step(trainer):
            pl_module.log("perf/tokens_per_s", self.tokens / self.seconds)
            if self.peak:
                pl_module.log("perf/mfu", self.flops / self.seconds / self.peak)
            self.tokens = self.seconds = self.flops = 0.0
