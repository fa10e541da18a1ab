"""Attention maps you can look at: the weights of one fixed validation example, per layer
and head, drawn as heatmaps.

At step 0 and every ``callbacks.probes.maps_every_n_steps`` steps (sparser than the
other probes: a map costs ~0.2 s to draw on a CPU) it writes
``<run dir>/attention_maps/step_<step>.png`` (a row of tiles per layer, a column per
head; padding cropped) and logs it to W&B as the image ``attn/maps``.
The example is the first of the validation split, the same at every step, run in eval
mode (no dropout) with no gradient, before that step's update: what the model attends
to at that point. ``attnlab-report`` shows the first and last of them side by side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


def mosaic(weights: dict[str, torch.Tensor], lengths: dict) -> tuple[np.ndarray, int, int]:
    """All layers' heads in one array: a row of tiles per layer, a column per head, each tile
    padded to the largest (n, m) with NaN (drawn blank) and one NaN cell between tiles."""
    cropped = {name: crop(name, layer_weights, lengths) for name, layer_weights in weights.items()}
    heads = max(w.shape[0] for w in cropped.values())
    rows = max(w.shape[1] for w in cropped.values()) + 1
    cols = max(w.shape[2] for w in cropped.values()) + 1
    canvas = np.full((rows * len(cropped) - 1, cols * heads - 1), np.nan, dtype=np.float32)
    for row, layer_weights in enumerate(cropped.values()):
        for head, tile in enumerate(layer_weights.numpy()):
            canvas[row * rows : row * rows + tile.shape[0], head * cols : head * cols + tile.shape[1]] = tile
    return canvas, rows, cols


def draw(weights: dict[str, torch.Tensor], lengths: dict, path: Path, step: int) -> Path:
    """One image, one Axes (drawing a panel per head cost seconds per probe step): rows of
    tiles are layers (queries down, keys across), columns are heads."""
    from matplotlib.figure import Figure  # no pyplot: nothing global, nothing to close

    canvas, rows, cols = mosaic(weights, lengths)
    heads = (canvas.shape[1] + 1) // cols
    scale = 0.16  # inches per cell
    fig = Figure(figsize=(canvas.shape[1] * scale + 2.2, canvas.shape[0] * scale + 1.0))
    ax = fig.add_axes((1.6 / (canvas.shape[1] * scale + 2.2), 0.3 / (canvas.shape[0] * scale + 1.0),
                       canvas.shape[1] * scale / (canvas.shape[1] * scale + 2.2),
                       canvas.shape[0] * scale / (canvas.shape[0] * scale + 1.0)))  # fmt: skip
    ax.imshow(np.ma.masked_invalid(canvas), vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
    ax.set_yticks([row * rows + (rows - 2) / 2 for row in range(len(weights))], list(weights), fontsize=8)
    ax.set_xticks([head * cols + (cols - 2) / 2 for head in range(heads)], [f"H{h}" for h in range(heads)], fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.text(0.01, 0.01, f"step {step}: weights of a fixed validation example, queries down, keys across "
             "(0 dark, 1 bright)", fontsize=7)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    return path
