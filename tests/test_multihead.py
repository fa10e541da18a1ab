"""The multi-head module against torch.nn.MultiheadAttention given the same weights."""

import pytest
import torch
from torch import nn

from attnlab.attention import AttentionConfig, MultiHeadAttention
from attnlab.probes import AttentionRecord, recording


def twin_layers(embed_dim=8, num_heads=2):
    """torch's MHA and ours, carrying the same projection weights."""
    reference = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
    ours = MultiHeadAttention(embed_dim, num_heads)
    w_q, w_k, w_v = reference.in_proj_weight.chunk(3)
    b_q, b_k, b_v = reference.in_proj_bias.chunk(3)
    with torch.no_grad():
        for proj, weight, bias in ((ours.q_proj, w_q, b_q), (ours.k_proj, w_k, b_k), (ours.v_proj, w_v, b_v)):
            proj.weight.copy_(weight)
            proj.bias.copy_(bias)
        ours.out_proj.weight.copy_(reference.out_proj.weight)
        ours.out_proj.bias.copy_(reference.out_proj.bias)
    return reference.eval(), ours.eval()


def test_spec_example_parity_with_torch_multihead_attention():
    reference, ours = twin_layers()
    x = torch.randn(1, 4, 8)
    expected, averaged_weights = reference(x, x, x)
    assert expected.shape == (1, 4, 8) and averaged_weights.shape == (1, 4, 4)
    torch.testing.assert_close(averaged_weights.sum(-1), torch.ones(1, 4))
    torch.testing.assert_close(ours(x), expected)
    with recording(ours) as [record]:  # the explicit path gives the same output and the same weights
        torch.testing.assert_close(ours(x), expected)
    torch.testing.assert_close(record.weights.mean(dim=1), averaged_weights)


@pytest.mark.parametrize("record", [False, True])
def test_parity_with_padding_and_causal_masks(record):
    reference, ours = twin_layers(embed_dim=16, num_heads=4)
    ours.record = AttentionRecord() if record else None
    x = torch.randn(3, 6, 16)
    lengths = torch.tensor([6, 4, 2])
    is_padding = torch.arange(6)[None, :] >= lengths[:, None]  # torch's convention: True = ignore
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    expected, _ = reference(x, x, x, key_padding_mask=is_padding, attn_mask=future)
    torch.testing.assert_close(ours(x, key_mask=~is_padding, causal=True), expected)


def test_cross_attention_parity():
    reference, ours = twin_layers(embed_dim=16, num_heads=4)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    expected, _ = reference(x, memory, memory)
    torch.testing.assert_close(ours(x, memory), expected)


def test_free_head_sizes():
    layer = MultiHeadAttention(32, n_heads=8, d_k=16, d_v=4)
    assert layer.q_proj.out_features == 8 * 16 and layer.v_proj.out_features == 8 * 4
    assert layer.out_proj.in_features == 8 * 4
    assert layer(torch.randn(2, 5, 32)).shape == (2, 5, 32)


def test_d_k_defaults_to_d_model_over_heads_and_refuses_a_remainder():
    assert MultiHeadAttention(48, 6).d_k == 8
    with pytest.raises(ValueError, match=r"d_model=50 is not divisible by n_heads=4.*set d_k"):
        MultiHeadAttention(50, 4)
    assert MultiHeadAttention(50, 4, d_k=10).d_k == 10


def test_recording_is_off_by_default_and_keeps_nothing():
    layer = MultiHeadAttention(16, 2, attn=AttentionConfig(scale="learned"))
    layer(torch.randn(2, 3, 16))
    assert layer.record is None
    with recording(layer) as [record]:
        layer(torch.randn(2, 3, 16)).sum().backward()
    assert record.logits.shape == (2, 2, 3, 3) and record.logits.grad is not None
    assert layer.record is None  # removed when the block ends; the record keeps its tensors


def test_the_record_marks_padded_queries_of_self_attention_and_of_a_masked_cross_attention():
    layer = MultiHeadAttention(16, 2)
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 5, 16)
    real = torch.tensor([[True] * 4, [True] * 2 + [False] * 2])
    real_memory = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    with recording(layer) as [record]:
        layer(x, key_mask=real, causal=True)
    visible = record.visible.expand(2, 2, 4, 4)
    expected = torch.ones(4, 4, dtype=torch.bool).tril() & real[:, None, None, :] & real[:, None, :, None]
    torch.testing.assert_close(visible, expected.expand(2, 2, 4, 4))
    # cross-attention: queries come from x, keys from memory; padded queries are masked by the caller
    with recording(layer) as [record]:
        out = layer(x, memory, key_mask=real_memory, attn_mask=real[:, None, :, None])
    visible = record.visible.expand(2, 2, 4, 5)
    torch.testing.assert_close(visible, (real[:, None, :, None] & real_memory[:, None, None, :]).expand(2, 2, 4, 5))
    assert (out[1, 2:] == layer.out_proj.bias).all()  # a query that sees nothing gets a zero mix
