"""Lightning callbacks that look inside training every ``every_n_steps`` optimizer steps.

Step 0 is always a probe step, so what the initialisation does is in the logs before
the first optimizer step. Metric names are those of the README's probe table, with the layer names of
attnlab.models (``L0``; ``enc.L0``, ``dec.self.L0``, ``dec.cross.L0``):

    grad/global_norm, grad/norm/<parameter path>          GradientProbe
    grad/logits/<layer>, grad/logits_row_median/<layer>,   AttentionProbe
    grad/softmax_jac/<layer>,
    attn/entropy/<layer>[.H<h>], attn/entropy_norm/<layer>,
    attn/logit_std/<layer>, attn/logit_max/<layer>, attn/saturation/<layer>
    attn/tau/<layer>.H<h>, attn/ssmax_s/<layer>.H<h>      TemperatureProbe (rules with parameters)
    act/<module path>                                     ActivationProbe (μP's coordinate check)
    attn/maps (an image; PNGs in <run dir>/attention_maps/) AttentionMaps (maps.py)

On a probe step the attention layers take the explicit path and record their logits;
the values are read after the real training backward, before the optimizer step (after
unscaling under mixed precision). Every other step takes the fast path and pays
nothing. Under DDP each rank measures its own share of the batch and the attention
statistics are combined exactly (sums over rows added, maxima taken, row norms gathered):
they equal one process's values on the whole global batch. The others are averaged over ranks.
"""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention import MultiHeadAttention
from attnlab.models import attention_layers
from attnlab.probes.record import AttentionRecord, start_recording, stop_recording
from attnlab.probes.statistics import SUMS, finish, records_sums


def log_step_metrics(trainer: L.Trainer, metrics: dict, reduce_op: str = "mean") -> None:
    """Reduce over DDP ranks in one collective, then write at this very step to every logger.

    (``self.log`` would hold the values until the next ``log_every_n_steps`` boundary and
    repeat them there; a probe's value belongs to the step it was measured at.)
    """
    if not metrics:
        return
    values = torch.stack([torch.as_tensor(value, dtype=torch.float32) for value in metrics.values()])
    values = trainer.strategy.reduce(values.to(trainer.strategy.root_device), reduce_op=reduce_op)
    if trainer.is_global_zero:
        row = dict(zip(metrics, values.tolist(), strict=True))
        for logger in trainer.loggers:
            logger.log_metrics(row, step=trainer.global_step)


def combine_ranks(strategy, found: list[dict]) -> list[dict]:
    """Every rank's ``layer_sums`` combined, in three collectives: sums added, maxima taken,
    the rows' gradient norms gathered (NaN-padded to a common length; the median skips NaN)."""
    sizes = [[found_layer[key].numel() for key in SUMS] for found_layer in found]
    flat = torch.cat([found_layer[key].reshape(-1) for found_layer in found for key in SUMS])
    flat = strategy.reduce(flat, reduce_op="sum").split([n for layer in sizes for n in layer])
    maxima = strategy.reduce(torch.stack([found_layer["logit_max"] for found_layer in found]), reduce_op="max")
    combined = []
    for index, found_layer in enumerate(found):
        parts = flat[index * len(SUMS) : (index + 1) * len(SUMS)]
        layer = {key: part.view_as(found_layer[key]) for key, part in zip(SUMS, parts, strict=True)}
        combined.append({**layer, "logit_max": maxima[index]})
    if "row_grad_norms" in found[0]:
        norms = [found_layer["row_grad_norms"] for found_layer in found]
        lengths = strategy.all_gather(torch.tensor([len(n) for n in norms], device=norms[0].device))  # (W, layers)
        longest = lengths.amax(dim=0).tolist()
        padded = torch.cat(
            [F.pad(n, (0, size - len(n)), value=math.nan) for n, size in zip(norms, longest, strict=True)]
        )
        gathered = strategy.all_gather(padded)  # (W, Σ longest)
        for layer, part in zip(combined, gathered.split(longest, dim=1), strict=True):
            layer["row_grad_norms"] = part.reshape(-1)
    return combined


class Probe(L.Callback):
    def __init__(self, every_n_steps: int = 50):
        if every_n_steps < 1:
            raise ValueError(f"callbacks.probes.every_n_steps={every_n_steps} must be >= 1")
        self.every_n_steps = every_n_steps

    def due(self, trainer: L.Trainer) -> bool:
        return trainer.global_step % self.every_n_steps == 0


class GradientProbe(Probe):
    """L2 norms of the attention projection, FFN and embedding weight gradients, and the global norm."""

    def on_fit_start(self, trainer, pl_module) -> None:
        model = pl_module.model
        weights = {name for name, module in model.named_modules() if isinstance(module, (nn.Linear, nn.Embedding))}
        # (metric name or None, parameter) for every parameter; tied weights appear once.
        self.parameters = [
            (f"grad/norm/{name.removesuffix('.weight')}" if name.removesuffix(".weight") in weights else None, param)
            for name, param in model.named_parameters()
        ]

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.due(trainer):
            return
        named = [(name, param.grad) for name, param in self.parameters if param.grad is not None]
        if not named:
            return
        # One fused call for all the norms, as torch.nn.utils.clip_grad_norm_ does.
        norms = torch._foreach_norm([grad for _, grad in named])
        metrics = {"grad/global_norm": torch.linalg.vector_norm(torch.stack(norms))}
        metrics.update((name, norm) for (name, _), norm in zip(named, norms, strict=True) if name)
        log_step_metrics(trainer, metrics)


class AttentionProbe(Probe):
    """Entropy, logit statistics, saturation and the gradient at the logits, per layer."""

    def __init__(self, every_n_steps: int = 50, chunk_size: int = 256):
        super().__init__(every_n_steps)
        self.chunk_size = chunk_size
        self.layers: list[MultiHeadAttention] = []
        self.records: list[AttentionRecord] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        self.layers = attention_layers(pl_module.model)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.due(trainer) and not self.records:
            self.records = start_recording(self.layers)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.records:
            return
        means, maxima = {}, {}
        for layer, stats in self.statistics(trainer):
            name = layer.name
            means[f"attn/entropy/{name}"] = stats["entropy"]
            for head, value in enumerate(stats["entropy_per_head"]):
                means[f"attn/entropy/{name}.H{head}"] = value
            means[f"attn/entropy_norm/{name}"] = stats["entropy_norm"]
            means[f"attn/logit_std/{name}"] = stats["logit_std"]
            means[f"attn/saturation/{name}"] = stats["saturation"]
            means[f"grad/softmax_jac/{name}"] = stats["softmax_jac"]
            if "grad_logits" in stats:
                means[f"grad/logits/{name}"] = stats["grad_logits"]
                means[f"grad/logits_row_median/{name}"] = stats["grad_logits_row_median"]
            maxima[f"attn/logit_max/{name}"] = stats["logit_max"]
        log_step_metrics(trainer, means)
        log_step_metrics(trainer, maxima, reduce_op="max")
        self.release()

    def statistics(self, trainer: L.Trainer) -> list[tuple[MultiHeadAttention, dict]]:
        """(layer, its statistics) for every layer this step called, in model order.

        Under DDP each rank's loss is the mean over its own share of the batch, so its
        gradient at the logits is world_size × that of the whole batch's loss: it is scaled
        back. The ranks' sums are added (rows weigh the same wherever they ran), maxima taken,
        and the rows' gradient norms gathered for the median: the values of one process on the
        whole global batch."""
        called = [(layer, record) for layer, record in zip(self.layers, self.records, strict=True) if record.filled]
        found = records_sums([record for _, record in called], self.chunk_size, grad_scale=1 / trainer.world_size)
        if trainer.world_size > 1:
            found = combine_ranks(trainer.strategy, found)
        return [(layer, finish(sums)) for (layer, _), sums in zip(called, found, strict=True)]

    def release(self) -> None:
        stop_recording(self.layers)
        self.records = []

    def on_train_end(self, trainer, pl_module) -> None:
        self.release()


class ActivationProbe(Probe):
    """Mean |x| of the output of the embedding, every attention layer, FFN and block, and the
    head: the quantities of μP's coordinate check (Yang et al. 2022, the mup package's
    ``get_coord_data``), whose growth with width over the first steps shows whether a
    parametrisation keeps activations of width-independent size.

    Logged as ``act/<module path>`` (e.g. ``act/encoder.layers.0.self_attn``) on probe steps,
    averaged over the step's forward passes. Hooks exist only during a probe step.
    """

    KINDS = ("Embedding", "MultiHeadAttention", "FeedForward", "Block", "OutputHead")

    def __init__(self, every_n_steps: int = 50):
        super().__init__(every_n_steps)
        self.hooks, self.sums = [], {}

    def on_fit_start(self, trainer, pl_module) -> None:
        self.modules = [(name, module) for name, module in pl_module.model.named_modules()
                        if type(module).__name__ in self.KINDS]  # fmt: skip

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.due(trainer) and not self.hooks:
            self.hooks = [module.register_forward_hook(self.keeper(name)) for name, module in self.modules]

    def keeper(self, name: str):
        def keep(module, inputs, output) -> None:
            if not module.training:  # another callback's forward in eval mode (the attention maps'): not training's
                return
            size = output.detach().abs().mean()  # no host sync: read once, at the optimizer step
            total, count = self.sums.get(name, (0.0, 0))
            self.sums[name] = (total + size, count + 1)

        return keep

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.hooks:
            return
        log_step_metrics(trainer, {f"act/{name}": total / count for name, (total, count) in self.sums.items()})
        self.release()

    def release(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks, self.sums = [], {}

    def on_train_end(self, trainer, pl_module) -> None:
        self.release()


class TemperatureProbe(Probe):
    """Per head, what each rule with parameters logs (``Temperature.logged``): τ for ``learned``
    (``attn/tau/<layer>.H<h>``), s for ``ssmax`` (``attn/ssmax_s/<layer>.H<h>``)."""

    def on_fit_start(self, trainer, pl_module) -> None:
        layers = attention_layers(pl_module.model)
        self.layers = [layer for layer in layers if any(True for _ in layer.temperature.parameters())]

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.layers or not self.due(trainer):
            return
        metrics = {}
        for layer in self.layers:
            for family, values in layer.temperature.logged().items():
                for head, value in enumerate(values):
                    metrics[f"attn/{family}/{layer.name}.H{head}"] = value
        log_step_metrics(trainer, metrics)


def build_probes(cfg) -> list[Probe]:
    """From ``conf/callbacks/*.yaml``: ``probes.every_n_steps`` and one switch per probe."""
    if not cfg or not cfg.get("enabled", True):
        return []
    every = cfg.every_n_steps
    probes = []
    if cfg.gradients:
        probes.append(GradientProbe(every))
    if cfg.attention:
        probes.append(AttentionProbe(every, cfg.chunk_size))
    if cfg.temperature:
        probes.append(TemperatureProbe(every))
    if cfg.get("activations", False):
        probes.append(ActivationProbe(every))
    if cfg.get("maps_every_n_steps"):
        from attnlab.probes.maps import AttentionMaps

        probes.append(AttentionMaps(cfg.maps_every_n_steps))
    return probes
