"""The contract every registered attention variant and τ rule must keep (README: "Adding
a variant", "Adding a temperature rule").

It runs over every variant in attnlab.attention.VARIANTS × every rule in TEMPERATURES
(and a fixed number), so a new variant or rule is checked as soon as it is registered;
REFERENCES holds independent implementations of the scores where one exists. The
rules' own formulas are checked by hand in test_attention.py.
"""

import contextlib
import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import user_rule  # noqa: F401  (a rule from outside the package: registering it is all it takes)
from attnlab.attention import TEMPERATURES, VARIANTS, AttentionConfig, MultiHeadAttention, key_counts, rule_options
from attnlab.probes import recording
from attnlab.train import CONF_DIR  # importing it registers the config schemas

CONF = Path(CONF_DIR) / "attention"
D_MODEL, HEADS = 16, 4


def reference_dot(layer, q, k):
    return q @ k.transpose(-2, -1)


def reference_cosine(layer, q, k):
    return F.cosine_similarity(q.unsqueeze(-2), k.unsqueeze(-3), dim=-1)


def reference_additive(layer, q, k):
    score = layer.score
    rows = []
    for head in range(q.shape[1]):  # one (query, key) pair at a time, as the formula reads
        pairs = torch.empty(q.shape[0], q.shape[2], k.shape[2])
        for i in range(q.shape[2]):
            for j in range(k.shape[2]):
                hidden = q[:, head, i] @ score.w_q[head] + score.bias[head, 0] + k[:, head, j] @ score.w_k[head]
                pairs[:, i, j] = torch.tanh(hidden) @ score.v[head, :, 0]
        rows.append(pairs)
    return torch.stack(rows, dim=1)


REFERENCES = {"dot": reference_dot, "cosine": reference_cosine, "additive": reference_additive}


@functools.cache
def attention_config(variant: str) -> dict:
    """conf/attention/<variant>.yaml as the run composes it (defaults included)."""
    with initialize_config_dir(str(CONF.parent), version_base="1.3"):
        return OmegaConf.to_container(compose("train", overrides=[f"attention={variant}"]).attention)


def make_layer(variant, scale):
    cfg = AttentionConfig(**{**attention_config(variant), "scale": scale})
    return MultiHeadAttention(D_MODEL, HEADS, d_k=6, d_v=5, attn=cfg).eval()


CASES = [(variant, scale) for variant in sorted(VARIANTS) for scale in [*sorted(TEMPERATURES), 2.5]]
pytestmark = pytest.mark.parametrize("variant,scale", CASES)


def test_every_variant_has_a_config_and_every_config_a_variant(variant, scale):
    assert (CONF / f"{variant}.yaml").exists(), f"add conf/attention/{variant}.yaml"
    named = {attention_config(path.stem)["variant"] for path in CONF.glob("*.yaml")}
    assert named <= set(VARIANTS)


def test_the_options_in_the_config_are_options_of_their_rule(variant, scale):
    for rule, options in attention_config(variant)["scale_options"].items():
        assert rule in TEMPERATURES, f"scale_options.{rule}: no such rule"
        assert set(options) <= set(rule_options(rule)), f"scale_options.{rule}: {set(options)}"


def test_tau_is_constant_along_the_keys_and_broadcasts_to_the_logits(variant, scale):
    layer = make_layer(variant, scale)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]
    tau = layer.temperature(key_counts(mask, True, 6, 6, "cpu"))
    if isinstance(tau, torch.Tensor):
        shape = torch.broadcast_shapes(tau.shape, (2, HEADS, 6, 1))
        assert shape == (2, HEADS, 6, 1), f"tau of shape {tuple(tau.shape)} varies along the keys"
        assert torch.isfinite(tau).all() and (tau > 0).all()
    else:
        assert tau > 0


def test_shapes_self_and_cross(variant, scale):
    layer = make_layer(variant, scale)
    x, memory = torch.randn(2, 3, D_MODEL), torch.randn(2, 7, D_MODEL)
    assert layer(x).shape == (2, 3, D_MODEL)
    assert layer(x, memory).shape == (2, 3, D_MODEL)
    with recording(layer) as [record]:
        layer(x, memory)
    assert record.weights.shape == record.logits.shape == (2, HEADS, 3, 7)


def test_causal_mask_never_leaks_the_future(variant, scale):
    layer = make_layer(variant, scale)
    x = torch.randn(2, 6, D_MODEL)
    changed = x.clone()
    changed[:, 4:] = torch.randn(2, 2, D_MODEL)
    torch.testing.assert_close(layer(x, causal=True)[:, :4], layer(changed, causal=True)[:, :4])
    assert not torch.allclose(layer(x, causal=True)[:, 4:], layer(changed, causal=True)[:, 4:])


def test_padding_mask_is_respected(variant, scale):
    layer = make_layer(variant, scale)
    x, memory = torch.randn(2, 3, D_MODEL), torch.randn(2, 6, D_MODEL)
    key_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    changed = memory.clone()
    changed[1, 4:] = 100 * torch.randn(2, D_MODEL)
    torch.testing.assert_close(layer(x, memory, key_mask=key_mask), layer(x, changed, key_mask=key_mask))
    with recording(layer) as [record]:
        layer(x, memory, key_mask=key_mask)
    assert (record.weights[1, :, :, 4:] == 0).all()


def test_a_row_that_sees_no_key_gives_zeros_and_finite_gradients(variant, scale):
    """A padded target position in cross-attention: its row is all masked."""
    layer = make_layer(variant, scale).train()
    x, memory = torch.randn(2, 3, D_MODEL), torch.randn(2, 4, D_MODEL)
    rows = torch.tensor([[True, True, True], [True, True, False]])[:, None, :, None]
    for record in (False, True):
        with recording(layer) if record else contextlib.nullcontext():
            out = layer(x, memory, attn_mask=rows)
            out.pow(2).sum().backward()
        torch.testing.assert_close(out[1, 2], layer.out_proj.bias.detach())
        assert all(torch.isfinite(param.grad).all() for param in layer.parameters())


def test_rows_of_weights_sum_to_one(variant, scale):
    layer = make_layer(variant, scale)
    with recording(layer) as [record]:
        layer(torch.randn(2, 5, D_MODEL), causal=True)
    torch.testing.assert_close(record.weights.sum(-1), torch.ones(2, HEADS, 5))
    assert (record.weights >= 0).all()


def test_permutation_equivariance(variant, scale):
    """Shuffling keys (with their values) changes nothing; shuffling queries shuffles outputs."""
    layer = make_layer(variant, scale)
    x, memory = torch.randn(2, 4, D_MODEL), torch.randn(2, 7, D_MODEL)
    keys, queries = torch.randperm(7), torch.randperm(4)
    torch.testing.assert_close(layer(x, memory[:, keys]), layer(x, memory))
    torch.testing.assert_close(layer(x[:, queries], memory), layer(x, memory)[:, queries])


def test_gradients_reach_every_parameter(variant, scale):
    layer = make_layer(variant, scale).train()
    layer(torch.randn(2, 5, D_MODEL), torch.randn(2, 6, D_MODEL)).pow(2).sum().backward()
    for name, param in layer.named_parameters():
        assert param.grad is not None, f"{name} gets no gradient"
        assert torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, name


def test_fast_and_explicit_paths_agree_with_their_gradients(variant, scale):
    """Outputs and every parameter's gradient (the rule's own included), padded and causal rows alike."""
    layer = make_layer(variant, scale)
    x = torch.randn(2, 5, D_MODEL)
    key_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    upstream = torch.randn(2, 5, D_MODEL)

    def run():
        out = layer(x, key_mask=key_mask, causal=True)
        return out, torch.autograd.grad((out * upstream).sum(), list(layer.parameters()))

    fast, fast_grads = run()
    with recording(layer):
        explicit, explicit_grads = run()
    torch.testing.assert_close(explicit, fast)
    for (name, _), fast_grad, explicit_grad in zip(layer.named_parameters(), fast_grads, explicit_grads, strict=True):
        torch.testing.assert_close(explicit_grad, fast_grad, rtol=1e-4, atol=1e-6, msg=name)


def test_matches_the_reference_implementation(variant, scale):
    if variant not in REFERENCES:
        pytest.skip(f"no independent reference for {variant!r}")
    layer = make_layer(variant, scale)
    x, memory = torch.randn(2, 3, D_MODEL), torch.randn(2, 4, D_MODEL)
    with recording(layer) as [record]:
        layer(x, memory)
    with torch.no_grad():
        q = layer.split_heads(layer.q_proj(x), layer.d_k)
        k = layer.split_heads(layer.k_proj(memory), layer.d_k)
        expected = REFERENCES[variant](layer, q, k) / layer.temperature(key_counts(None, False, 3, 4, "cpu"))
    torch.testing.assert_close(record.logits.detach(), expected, rtol=1e-4, atol=1e-5)
