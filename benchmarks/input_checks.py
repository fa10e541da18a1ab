"""What MultiHeadAttention's input checks cost per call, against one layer's forward+backward.

.venv/bin/python benchmarks/input_checks.py      # two rounds; run it twice
"""

import time

import torch

from attnlab.attention import MultiHeadAttention

torch.set_num_threads(2)
torch.manual_seed(0)
layer = MultiHeadAttention(256, 8)
x = torch.randn(32, 128, 256)
mask = torch.rand(32, 128) > 0.1


def step():
    layer(x, key_mask=mask, causal=True).sum().backward()


for _ in range(3):
    step()
for rnd in range(2):
    t = time.perf_counter()
    [step() for _ in range(20)]
    s = (time.perf_counter() - t) / 20
    t = time.perf_counter()
    [layer.check_inputs(x, x, mask, None) for _ in range(20000)]
    c = (time.perf_counter() - t) / 20000
    print(f"round {rnd}: layer fwd+bwd {s * 1e3:.2f} ms, input checks {c * 1e6:.2f} us, ratio {c / s:.2e}")
