"""Probes: Lightning callbacks that measure attention during training (see callbacks.py)."""

from attnlab.probes.callbacks import (
    ActivationProbe,
    AttentionProbe,
    GradientProbe,
    Probe,
    TemperatureProbe,
    build_probes,
)
from attnlab.probes.record import AttentionRecord, recording, start_recording, stop_recording
from attnlab.probes.statistics import attention_entropy, layer_statistics, records_statistics

__all__ = [
    "ActivationProbe",
    "AttentionProbe",
    "AttentionRecord",
    "GradientProbe",
    "Probe",
    "TemperatureProbe",
    "attention_entropy",
    "build_probes",
    "layer_statistics",
    "recording",
    "records_statistics",
    "start_recording",
    "stop_recording",
]
