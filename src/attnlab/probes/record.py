"""What an attention layer keeps of one call while a probe watches it.

A probe installs an empty ``AttentionRecord`` on each layer (``start_recording``);
while one is installed the layer takes the explicit path and fills it on every call
(the last call wins). The probe reads the record after the backward, then removes it
(``stop_recording``); with no record installed a layer keeps nothing and takes the
fast path. In a notebook or a test, ``recording`` does both around a block:

    with recording(layer) as [record]:
        layer(x).sum().backward()
    record.logits.grad, record.weights, record.visible
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from torch import Tensor, nn


@dataclass
class AttentionRecord:
    """One attention call: its scaled logits, its weights, and which entries were visible.

    logits:  (B, h, n, m) score / τ, with its gradient retained for the backward
    weights: (B, h, n, m) softmax of the logits over the visible keys
    visible: bool, broadcastable to (B, h, n, m), True = key j was visible to query i.
             A padded query sees no key, so its row is all False; None = all visible.
    """

    logits: Tensor | None = None
    weights: Tensor | None = None
    visible: Tensor | None = None

    def keep(self, logits: Tensor, weights: Tensor, visible: Tensor | None) -> None:
        if logits.requires_grad:
            logits.retain_grad()
        self.logits, self.weights, self.visible = logits, weights, visible

    @property
    def filled(self) -> bool:
        return self.logits is not None


def start_recording(layers: Iterable[nn.Module]) -> list[AttentionRecord]:
    """Install a fresh record on each attention layer; returns them in the same order."""
    records = []
    for layer in layers:
        layer.record = AttentionRecord()
        records.append(layer.record)
    return records


def stop_recording(layers: Iterable[nn.Module]) -> None:
    """Remove the records: the layers go back to the fast path and hold no tensors."""
    for layer in layers:
        layer.record = None


@contextmanager
def recording(*layers: nn.Module) -> Iterator[list[AttentionRecord]]:
    """Record the given layers inside the block; the records stay readable after it."""
    try:
        yield start_recording(layers)
    finally:
        stop_recording(layers)
