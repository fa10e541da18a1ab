"""The functional core and temperature rules against hand-computed values and torch's SDPA."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import (
    TEMPERATURES,
    AttentionConfig,
    MultiHeadAttention,
    Score,
    Temperature,
    attention,
    key_counts,
    make_temperature,
    register_temperature,
    register_variant,
    tau_values,
)
from attnlab.probes import recording

RULES = ["none", "sqrt_dk", "dk", "learned", 2.5]


def expected_tau(rule, d_k):
    return {"none": 1.0, "sqrt_dk": math.sqrt(d_k), "dk": float(d_k), "learned": math.sqrt(d_k)}.get(rule, rule)


# --- reference examples, by hand ---------------------------------------------------------


def test_spec_example_weights_and_output():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out, weights = attention(x, x, x, tau=math.sqrt(2), need_weights=True)
    expected_weights = torch.tensor([[0.401, 0.198, 0.401], [0.198, 0.401, 0.401], [0.248, 0.248, 0.503]])
    expected_out = torch.tensor([[0.802, 0.599], [0.599, 0.802], [0.752, 0.752]])
    torch.testing.assert_close(weights, expected_weights, atol=1.5e-3, rtol=0)
    torch.testing.assert_close(out, expected_out, atol=1.5e-3, rtol=0)
    fast_out, none = attention(x, x, x, tau=math.sqrt(2))
    assert none is None
    torch.testing.assert_close(fast_out, out)


def test_spec_example_causal_mask():
    scores = torch.tensor([[2.0, 1.0, 0.5], [1.2, 2.1, 0.7], [0.8, 1.3, 2.2]])
    # q = scores, k = I makes q kᵀ = scores, so the function sees exactly these logits.
    _, weights = attention(scores, torch.eye(3), torch.eye(3), tau=1.0, causal=True, need_weights=True)
    expected = torch.tensor([[1.0, 0.0, 0.0], [0.289, 0.711, 0.0], [0.149, 0.246, 0.605]])
    torch.testing.assert_close(weights, expected, atol=1.5e-3, rtol=0)


# --- temperature rules -----------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES)
def test_rule_values(rule):
    d_k, heads = 16, 4
    temperature = make_temperature(rule, d_k, heads)
    torch.testing.assert_close(tau_values(temperature), torch.full((heads,), expected_tau(rule, d_k)))


def test_rule_table_is_public_and_complete():
    assert {"none", "sqrt_dk", "dk", "learned", "mup", "log_n", "ssmax"} <= set(TEMPERATURES)


def test_registering_checks_the_class_and_refuses_a_taken_name():
    with pytest.raises(TypeError, match=r"temperature rule 'odd' must be a subclass of attnlab.attention.Temperature"):
        register_temperature("odd")(object)
    with pytest.raises(ValueError, match=r"temperature rule 'sqrt_dk' is already registered by"):
        register_temperature("sqrt_dk")(type("Other", (Temperature,), {}))
    with pytest.raises(ValueError, match=r"variant 'dot' is already registered by"):
        register_variant("dot")(type("Other", (Score,), {}))
    assert TEMPERATURES["sqrt_dk"].__name__ == "SqrtDk"  # the refused class did not replace it


def test_number_as_string_is_a_fixed_divisor():
    assert make_temperature("3.5", 8, 2)() == 3.5


@pytest.mark.parametrize("bad", ["sqrt", "learnt", -1.0, 0, "0"])
def test_bad_rule_names_the_value_and_the_choices(bad):
    with pytest.raises(ValueError) as err:
        make_temperature(bad, 8, 2)
    message = str(err.value)
    assert str(bad) in message
    if isinstance(bad, str) and not bad.isdigit():
        assert "sqrt_dk" in message and "learned" in message


def test_learned_per_layer_and_custom_init():
    temperature = make_temperature("learned", 64, 8, init=2.0, per_head=False)  # scale_options.learned
    assert temperature.log_tau.shape == (1, 1, 1)
    torch.testing.assert_close(tau_values(temperature), torch.full((8,), 2.0))


# --- rules that see the number of keys, the soft cap, μP ---------------------------------

PADDED = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # batch 1: the last 2 keys are padding


def test_key_counts_by_hand():
    mask = PADDED[:, None, None, :]
    counts = key_counts(mask, True, 5, 5, "cpu")
    assert counts.shape == (2, 1, 5, 1)
    assert counts[:, 0, :, 0].tolist() == [[1, 2, 3, 4, 5], [1, 2, 3, 3, 3]]
    assert key_counts(mask, False, 5, 5, "cpu").flatten().tolist() == [5, 3]  # one count per sequence
    assert key_counts(None, True, 3, 5, "cpu").flatten().tolist() == [1, 2, 3]  # top-left aligned, as SDPA
    assert key_counts(None, False, 3, 4, "cpu").flatten().tolist() == [4]
    nothing = torch.zeros(1, 1, 2, 4, dtype=torch.bool)  # rows that see no key count as 1, never 0
    assert key_counts(nothing, False, 2, 4, "cpu").flatten().tolist() == [1, 1]


def recorded_logits(layer, x, **kwargs):
    """The logits softmax sees (explicit path), and q·k by hand from the layer's own projections."""
    with recording(layer) as [record]:
        layer(x, **kwargs)
    with torch.no_grad():
        q = layer.split_heads(layer.q_proj(x), layer.d_k)
        k = layer.split_heads(layer.k_proj(x), layer.d_k)
    return record.logits.detach(), q @ k.transpose(-2, -1)


# n per query row of batch 1 under PADDED + causal: rows 0..4 see 1, 2, 3, 3, 3 keys; n < 2 counts as 2.
LOG_N = torch.tensor([[math.log(n) for n in (2, 2, 3, 4, 5)], [math.log(n) for n in (2, 2, 3, 3, 3)]])


def test_log_n_scales_each_row_by_the_log_of_its_visible_keys():
    layer = MultiHeadAttention(16, 2, attn=AttentionConfig(scale="log_n")).eval()
    logits, dots = recorded_logits(layer, torch.randn(2, 5, 16), key_mask=PADDED, causal=True)
    expected = dots / math.sqrt(8) * LOG_N[:, None, :, None]
    visible = PADDED[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(logits[visible.expand_as(logits)], expected[visible.expand_as(expected)])


def test_ssmax_multiplies_by_s_log_n_per_head():
    layer = MultiHeadAttention(16, 2, attn=AttentionConfig(scale="ssmax")).eval()
    with torch.no_grad():
        layer.temperature.s.copy_(torch.tensor([0.5, 2.0]).view(2, 1, 1))
    logits, dots = recorded_logits(layer, torch.randn(2, 5, 16), key_mask=PADDED, causal=True)
    expected = dots / math.sqrt(8) * torch.tensor([0.5, 2.0]).view(1, 2, 1, 1) * LOG_N[:, None, :, None]
    visible = (PADDED[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()).expand_as(logits)
    torch.testing.assert_close(logits[visible], expected[visible])


def test_ssmax_starts_equal_to_sqrt_dk_at_its_base_length():
    rule = make_temperature("ssmax", 16, 4, base_length=20)
    torch.testing.assert_close(rule(torch.tensor([[20.0]])), torch.full((4, 1, 1), 4.0))
    assert rule(torch.tensor([[40.0]])).max() < 4.0  # longer rows: sharper (a smaller τ)
    assert set(rule.logged()) == {"ssmax_s"} and rule.logged()["ssmax_s"].shape == (4,)


@pytest.mark.parametrize("d_k,base,expected", [(64, 64, 8.0), (16, 64, 2.0), (256, 64, 32.0), (32, 16, 8.0)])
def test_mup_multiplier_is_sqrt_dk_at_the_base_width_and_grows_like_dk(d_k, base, expected):
    rule = make_temperature("mup", d_k, 2, base_d_k=base)
    assert rule() == pytest.approx(expected)
    if d_k == base:
        assert rule() == pytest.approx(math.sqrt(d_k))


@pytest.mark.parametrize("scale", ["none", "sqrt_dk", "learned"])
def test_softcap_bounds_the_logits_and_is_the_formula(scale):
    cap = 3.0
    layer = MultiHeadAttention(16, 2, attn=AttentionConfig(scale=scale, softcap=cap)).eval()
    x = 4 * torch.randn(2, 5, 16)  # large logits, well past the cap
    logits, dots = recorded_logits(layer, x, key_mask=PADDED)
    uncapped = dots / layer.temperature().detach() if scale == "learned" else dots / make_temperature(scale, 8, 2)()
    assert uncapped.abs().max() > 2 * cap
    visible = PADDED[:, None, None, :].expand_as(logits)
    assert logits[visible].abs().max() <= cap  # (−c, c), closed in float32 where tanh rounds to ±1
    torch.testing.assert_close(logits[visible], (cap * torch.tanh(uncapped / cap))[visible])
    # A capped layer takes the explicit path even when nothing records: the output is the formula's.
    weights = torch.softmax((cap * torch.tanh(uncapped / cap)).masked_fill(~visible, -1e9), dim=-1)
    with torch.no_grad():
        v = layer.split_heads(layer.v_proj(x), layer.d_v)
        expected = layer.out_proj((weights @ v).transpose(1, 2).reshape(2, 5, 16))
        torch.testing.assert_close(layer(x, key_mask=PADDED), expected, rtol=1e-4, atol=1e-5)


def test_zero_query_init_gives_uniform_weights_and_still_learns_w_q():
    layer = MultiHeadAttention(16, 2, attn=AttentionConfig(scale="mup", zero_query_init=True))
    x = torch.randn(2, 5, 16)
    with recording(layer) as [record]:
        layer(x).pow(2).sum().backward()
    torch.testing.assert_close(record.weights.detach(), torch.full((2, 2, 5, 5), 0.2))
    assert layer.q_proj.weight.grad.abs().sum() > 0


# --- fast path = SDPA = explicit path ----------------------------------------------------


def qkv(batch=2, heads=4, n=5, m=7, d_k=8, d_v=6, grad=True):
    q = torch.randn(batch, heads, n, d_k, requires_grad=grad, dtype=torch.float64)
    k = torch.randn(batch, heads, m, d_k, requires_grad=grad, dtype=torch.float64)
    v = torch.randn(batch, heads, m, d_v, requires_grad=grad, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("rule", RULES)
def test_matches_torch_sdpa_for_every_rule(rule):
    q, k, v = qkv()
    tau = make_temperature(rule, q.shape[-1], q.shape[1]).double()()
    ours, _ = attention(q, k, v, tau=tau)
    reference = F.scaled_dot_product_attention(q, k, v, scale=1 / expected_tau(rule, q.shape[-1]))
    torch.testing.assert_close(ours, reference)


def random_mask(batch, heads, n, m):
    mask = torch.rand(batch, 1, n, m) > 0.3
    mask[..., 0] = True  # every row sees at least one key here; full masking is tested below
    return mask.expand(batch, heads, n, m)


@pytest.mark.parametrize("masking", ["none", "mask", "causal", "mask+causal"])
@pytest.mark.parametrize("tau_kind", ["float", "per_head"])
def test_fast_and_explicit_paths_agree_forward_and_backward(masking, tau_kind):
    q, k, v = qkv(n=6, m=6)
    tau = 2.0 if tau_kind == "float" else torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    if tau_kind == "per_head":
        tau = tau.view(4, 1, 1).requires_grad_()
    mask = random_mask(2, 4, 6, 6) if "mask" in masking else None
    causal = "causal" in masking
    upstream = torch.randn(2, 4, 6, 6, dtype=torch.float64)

    grads = []
    for need_weights in (False, True):
        out, weights = attention(q, k, v, tau=tau, mask=mask, causal=causal, need_weights=need_weights)
        inputs = (q, k, v) + ((tau,) if isinstance(tau, torch.Tensor) else ())
        grads.append((out, *torch.autograd.grad((out * upstream).sum(), inputs)))
    for fast, explicit in zip(*grads, strict=True):
        torch.testing.assert_close(fast, explicit)
    if mask is not None:
        assert (weights[~(mask & (torch.ones(6, 6).tril().bool() if causal else True))] == 0).all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_rows_give_zeros_and_finite_gradients(need_weights):
    q, k, v = qkv(n=3, m=4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    out, weights = attention(q, k, v, tau=2.0, mask=mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    assert (out[:, :, 1] == 0).all()
    if need_weights:
        assert (weights[:, :, 1] == 0).all()
        torch.testing.assert_close(weights[:, :, [0, 2]].sum(-1), torch.ones(2, 4, 2, dtype=torch.float64))
    out.sum().backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all()
    assert (q.grad[:, :, 1] == 0).all()


def test_learned_tau_receives_gradient_through_the_fast_path():
    layer = MultiHeadAttention(32, 4, attn=AttentionConfig(scale="learned"))
    x = torch.randn(2, 5, 32)
    layer(x, causal=True).pow(2).sum().backward()
    grad = layer.temperature.log_tau.grad
    assert grad is not None and grad.shape == (4, 1, 1)
    assert (grad.abs() > 0).all()
    # and it is the gradient the explicit path gives
    fast_grad = grad.clone()
    layer.zero_grad()
    with recording(layer):
        layer(x, causal=True).pow(2).sum().backward()
    torch.testing.assert_close(layer.temperature.log_tau.grad, fast_grad, rtol=1e-4, atol=1e-6)


# --- the science at initialisation -------------------------------------------------------


@pytest.mark.parametrize("d_k", [4, 16, 64, 256])
def test_monte_carlo_variance_of_dot_product_is_d_k(d_k):
    generator = torch.Generator().manual_seed(d_k)
    q = torch.randn(200_000, d_k, generator=generator)
    k = torch.randn(200_000, d_k, generator=generator)
    variance = (q * k).sum(-1).var().item()
    # the sample variance of 2e5 draws has relative std ≈ sqrt(2 / 2e5) · sqrt(kurtosis) < 1%
    assert variance == pytest.approx(d_k, rel=0.03)


@pytest.mark.parametrize("d_k", [16, 64, 256])
@pytest.mark.parametrize("rule", ["none", "sqrt_dk", "dk"])
def test_scaled_logit_std_at_init_follows_the_rule(rule, d_k):
    """Unit-variance inputs through the initialised projections: std(q·k/τ) ≈ √d_k / τ."""
    heads = 4
    layer = MultiHeadAttention(256, heads, d_k=d_k, attn=AttentionConfig(scale=rule))
    with torch.no_grad(), recording(layer) as [record]:
        layer(torch.randn(8, 64, 256))
    predicted = {"none": math.sqrt(d_k), "sqrt_dk": 1.0, "dk": 1 / math.sqrt(d_k)}[rule]
    assert record.logits.std().item() == pytest.approx(predicted, rel=0.15)


# --- the API checks its inputs at the boundary ------------------------------------------


def float_qkv(n=3, m=4, d_k=8, d_v=8, lead=(2, 2)):
    return torch.randn(*lead, n, d_k), torch.randn(*lead, m, d_k), torch.randn(*lead, m, d_v)


@pytest.mark.parametrize(
    "change,error,expected",
    [
        (lambda q, k, v: (q, k[..., :5], v), ValueError, r"must share d_k; got q \(2, 2, 3, 8\), k \(2, 2, 4, 5\)"),
        (lambda q, k, v: (q, k, v[..., :3, :]), ValueError, r"k \(..., m, d_k\) and v \(..., m, d_v\) must share m"),
        (lambda q, k, v: (q[0, 0, 0], k, v), ValueError, r"shape \(..., length, dim\); got q \(8,\)"),
        (lambda q, k, v: (q, k[:1].expand(3, 2, 4, 8), v), ValueError, r"matching leading \(batch, head\) dims"),
    ],
)
def test_mismatched_shapes_name_the_arguments(change, error, expected):
    with pytest.raises(error, match=expected):
        attention(*change(*float_qkv()))


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_mask_of_the_wrong_shape_or_type_is_refused(need_weights):
    q, k, v = float_qkv()
    with pytest.raises(
        ValueError, match=r"mask of shape \(3, 3\) does not broadcast to \(..., n, m\) = \(2, 2, 3, 4\)"
    ):
        attention(q, k, v, mask=torch.ones(3, 3, dtype=torch.bool), need_weights=need_weights)
    with pytest.raises(TypeError, match=r"mask must be a bool tensor.*got torch.float32.*mask.bool\(\)"):
        attention(q, k, v, mask=torch.ones(3, 4), causal=True, need_weights=need_weights)


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf")])
def test_a_tau_that_is_not_finite_and_positive_is_refused(tau):
    q, k, v = float_qkv()
    with pytest.raises(ValueError, match=r"tau=.* is not valid; it must be a finite number > 0"):
        attention(q, k, v, tau=tau)
    with pytest.raises(ValueError, match=r"tau must be finite and > 0"):
        attention(q, k, v, tau=torch.full((2, 1, 1), tau))
    with pytest.raises(ValueError, match=r"is not valid"):
        make_temperature(tau, 8, 2)


def test_a_tau_tensor_that_does_not_broadcast_is_refused():
    q, k, v = float_qkv()
    with pytest.raises(ValueError, match=r"tau of shape \(3, 1, 1\) does not broadcast to q's shape"):
        attention(q, k, v, tau=torch.ones(3, 1, 1))


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"n_heads": 0}, r"n_heads=0 is not valid; it must be a positive integer"),
        ({"d_k": 0}, r"d_k=0 is not valid"),
        ({"d_v": -2}, r"d_v=-2 is not valid"),
        ({"d_v": 0}, r"d_v=0 is not valid"),
        ({"d_model": 8.5}, r"d_model=8.5 is not valid"),
    ],
)
def test_multihead_sizes_are_checked(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        MultiHeadAttention(**{"d_model": 8, "n_heads": 2, **kwargs})


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"dropout": 1.5}, r"dropout=1.5 is not valid; it must be a number in \[0, 1\)"),
        ({"scale": "learned", "scale_options": {"learned": {"init": 0.0}}}, r"scale_options.learned.init=0.0 is not"),
        ({"scale": "learned", "scale_options": {"learned": {"int": 2}}}, r"learned.int is not an option .* init, per"),
        ({"scale": "ssmax", "scale_options": {"ssmax": {"base_length": 1}}}, r"ssmax.base_length=1 is not valid"),
        ({"softcap": 0}, r"softcap=0 is not valid; it must be a finite number > 0"),
        ({"scale": "sqrt"}, r"scale='sqrt' is not valid; accepted values: none, sqrt_dk, dk, learned"),
        ({"variant": "bilinear"}, r"variant='bilinear' is not a registered variant"),
    ],
)
def test_attention_config_is_checked(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        AttentionConfig(**kwargs)


def test_multihead_inputs_are_checked():
    layer = MultiHeadAttention(d_model=8, n_heads=2)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, length, d_model=8\); got \(2, 5, 6\)"):
        layer(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"key_mask must be a bool tensor of shape \(batch, keys\) = \(2, 5\)"):
        layer(x, key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 4\) does not broadcast"):
        layer(x, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"x and source must share the batch size"):
        layer(x, source=torch.randn(3, 5, 8))
