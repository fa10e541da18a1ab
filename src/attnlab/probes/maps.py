"""Attention maps you can look at: the weights of one fixed validation example, per layer
and head, drawn as heatmaps on probe steps.

Each probe step writes ``<run dir>/attention_maps/step_<step>.png`` (one row per layer,
one column per head; padding cropped) and logs it to W&B as the image ``attn/maps``.
The example is the first of the validation split, the same at every step, run in eval
mode (no dropout) with no gradient, before that step's update: what the model attends
to at that point. ``attnlab-report`` shows the first and last of them side by side.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.models import attention_layers
from attnlab.probes.callbacks import Probe
from attnlab.probes.record import start_recording
from attnlab.runs import MAPS_DIR


def first_example(batch: dict) -> dict:
    return {key: value[:1] for key, value in batch.items() if isinstance(value, torch.Tensor)}


def real_length(example: dict, key: str) -> int | None:
    return int(example[key][0].sum()) if key in example else None


class AttentionMaps(Probe):
    def on_fit_start(self, trainer, pl_module) -> None:
        self.layers = attention_layers(pl_module.model)
        self.example = None
        if trainer.is_global_zero and trainer.datamodule is not None:
            self.example = first_example(next(iter(trainer.datamodule.val_dataloader())))
            self.out = Path(trainer.default_root_dir) / MAPS_DIR

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.example is None or not self.due(trainer):
            return
        weights = self.weights(pl_module)
        path = draw(weights, self.lengths(), self.out / f"step_{trainer.global_step:06d}.png", trainer.global_step)
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):  # WandbLogger
                logger.log_image("attn/maps", [str(path)], step=trainer.global_step)

    @torch.no_grad()
    def weights(self, pl_module) -> dict[str, torch.Tensor]:
        """{layer name: (h, n, m) weights} of the example; probes already recording this step are left as they were."""
        kept = [layer.record for layer in self.layers]
        was_training = pl_module.training
        pl_module.eval()
        try:
            records = start_recording(self.layers)
            pl_module({key: value.to(pl_module.device) for key, value in self.example.items()})
            recorded = zip(self.layers, records, strict=True)
            return {layer.name: record.weights[0].float().cpu() for layer, record in recorded if record.filled}
        finally:
            for layer, record in zip(self.layers, kept, strict=True):
                layer.record = record
            pl_module.train(was_training)

    def lengths(self) -> dict[str, int | None]:
        """Real (unpadded) lengths: source/encoder keys, target/decoder queries, LM tokens."""
        return {"src": real_length(self.example, "src_mask"), "tgt": real_length(self.example, "tgt_mask"),
                "tokens": real_length(self.example, "mask")}  # fmt: skip


def crop(name: str, weights: torch.Tensor, lengths: dict) -> torch.Tensor:
    """Drop padded queries and keys: encoder n=m=src; decoder self n=m=tgt; cross n=tgt, m=src; LM tokens."""
    if name.startswith("enc."):
        rows = cols = lengths["src"]
    elif name.startswith("dec.cross"):
        rows, cols = lengths["tgt"], lengths["src"]
    elif name.startswith("dec."):
        rows = cols = lengths["tgt"]
    else:
        rows = cols = lengths["tokens"]
    return weights[:, :rows, :cols]


def draw(weights: dict[str, torch.Tensor], lengths: dict, path: Path, step: int) -> Path:
    from attnlab.report.figures import plt  # matplotlib with the file-only backend

    heads = max(w.shape[0] for w in weights.values())
    fig, axes = plt.subplots(len(weights), heads, figsize=(2.2 * heads + 0.6, 2.2 * len(weights) + 0.4),
                             squeeze=False)  # fmt: skip
    for row, (name, layer_weights) in enumerate(weights.items()):
        layer_weights = crop(name, layer_weights, lengths)
        for head in range(heads):
            ax = axes[row][head]
            ax.set_xticks([])
            ax.set_yticks([])
            if head >= layer_weights.shape[0]:
                ax.axis("off")
                continue
            ax.imshow(layer_weights[head].numpy(), vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
            ax.set_title(f"{name} · H{head}", fontsize=8)
            if head == 0:
                ax.set_ylabel("query", fontsize=7)
            if row == len(weights) - 1:
                ax.set_xlabel("key", fontsize=7)
    fig.suptitle(f"attention weights of a fixed validation example, step {step} (0 = dark, 1 = bright)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
