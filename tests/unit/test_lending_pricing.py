"""Cost fits: uniform vs work-scaled estimates, unpriced cases, loads, token profiles (reference §5)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.config.lending import LendingSettings
from routerd.lending.pricing import (
    client_output_limit,
    estimate_text,
    fewest_prompt_tokens,
    fit_loads,
    fit_model,
    fit_node,
    fit_token_profile,
    has_spread,
    predict,
    predict_queue,
)
from routerd.store.samples import LoadSample, RequestSample
from routerd.wire.lending import ModelCost, TokenProfile


def image(
    ms: float, work: float, *, model: str = "flux", at: int = 1000, status: str = "ok"
) -> RequestSample:
    return RequestSample(model, "image", (work,), ms, status, at)


def text(
    ms: float, prompt: float, output: float, *, model: str = "chat", body: int = 0, at: int = 1000
) -> RequestSample:
    return RequestSample(model, "llm", (prompt, output), ms, "ok", at, request_bytes=body)


def load(ms: float, config: str = "b.kcpps", *, status: str = "ok", at: int = 1000) -> LoadSample:
    return LoadSample(config, "b", "image", ms, status, at)


# -- fit_model ------------------------------------------------------------------------------------------


def test_too_few_samples_leave_the_model_unpriced() -> None:
    samples = [image(1000.0 + 10 * i, 100.0 * (i + 1)) for i in range(19)]
    assert fit_model(samples, 20) is None
    assert fit_model([*samples, image(1195.0, 1950.0)], 20) is not None


def test_identical_work_is_priced_at_the_mean_duration_for_that_work_only() -> None:
    cost = fit_model([image(ms, 5_000_000.0) for ms in (9000, 10000, 11000)] * 7, 20)
    assert cost is not None
    assert cost.uniform_work == (5_000_000.0,)
    assert cost.slopes_ms == (0.0,)
    assert cost.base_ms == pytest.approx(10000)
    assert predict(cost, (5_000_000.0,)) == pytest.approx(10000)
    assert predict(cost, (5_400_000.0,)) == pytest.approx(10000)  # within ±10 %
    assert predict(cost, (10_000_000.0,)) is None  # double the work: unpriced
    assert predict_queue(cost, 3, (15_000_000.0,)) == pytest.approx(30000)
    assert predict_queue(cost, 3, (30_000_000.0,)) is None


def test_spread_below_five_percent_counts_as_uniform_with_zero_slope() -> None:
    samples = [image(1000.0 + i, 1000.0 + (i % 3)) for i in range(20)]
    cost = fit_model(samples, 20)
    assert cost is not None and cost.uniform_work is not None
    assert cost.slopes_ms == (0.0,)


def test_spread_test_is_a_five_percent_coefficient_of_variation() -> None:
    assert not has_spread([100.0] * 10)
    assert not has_spread([0.0] * 10)
    assert has_spread([90.0, 110.0] * 5)  # cv 10 %
    assert not has_spread([98.0, 102.0] * 5)  # cv 2 %


def test_varied_work_is_fitted_by_least_squares() -> None:
    samples = [image(500.0 + 0.002 * w, w) for w in range(1_000_000, 5_000_000, 200_000)]
    cost = fit_model(samples, 20)
    assert cost is not None and cost.uniform_work is None
    assert cost.base_ms == pytest.approx(500.0, rel=1e-6)
    assert cost.slopes_ms[0] == pytest.approx(0.002, rel=1e-6)
    assert predict(cost, (10_000_000.0,)) == pytest.approx(20500.0, rel=1e-6)
    assert predict_queue(cost, 2, (3_000_000.0,)) == pytest.approx(1000.0 + 6000.0, rel=1e-6)


def test_a_negative_slope_leaves_the_model_unpriced() -> None:
    samples = [image(10000.0 - 0.001 * w, w) for w in range(1_000_000, 5_000_000, 200_000)]
    assert fit_model(samples, 20) is None


def test_a_negative_intercept_is_clamped_to_zero() -> None:
    samples = [image(-300.0 + 0.01 * w, w) for w in range(100_000, 500_000, 20_000)]
    cost = fit_model(samples, 20)
    assert cost is not None
    assert cost.base_ms == 0.0
    assert cost.slopes_ms[0] == pytest.approx(0.01, rel=1e-6)


def test_two_term_text_fit_recovers_prefill_and_decode_slopes() -> None:
    samples = [
        text(50.0 + 0.4 * p + 20.0 * o, p, o)
        for p, o in [(100 + 37 * i, 10 + (i * 7) % 23) for i in range(30)]
    ]
    cost = fit_model(samples, 20)
    assert cost is not None
    assert cost.base_ms == pytest.approx(50.0, abs=1e-6)
    assert cost.slopes_ms == pytest.approx((0.4, 20.0))


def test_one_constant_term_among_varied_ones_is_held_at_its_mean_and_the_others_fitted() -> None:
    """A model whose answers are all 16 tokens, asked prompts of every length (a real llama-server
    answering the tiny test model's one sentence): priced by prompt, for answers near 16 tokens only."""
    samples = [text(50.0 + 0.4 * p + 20.0 * 16, p, 16) for p in range(100, 2100, 100)]
    cost = fit_model(samples, 20)
    assert cost is not None
    assert cost.uniform_work == (0.0, 16.0)
    assert cost.base_ms == pytest.approx(50.0 + 20.0 * 16, abs=1e-6)
    assert cost.slopes_ms == pytest.approx((0.4, 0.0))
    assert predict(cost, (1000.0, 17.0)) == pytest.approx(370.0 + 400.0)
    assert predict(cost, (5000.0, 16.0)) == pytest.approx(370.0 + 2000.0)  # the fitted term extrapolates
    assert predict(cost, (1000.0, 40.0)) is None  # the held one does not
    assert predict_queue(cost, 2, (3000.0, 32.0)) == pytest.approx(2 * 370.0 + 1200.0)
    assert predict_queue(cost, 2, (3000.0, 64.0)) is None


def test_collinear_terms_leave_the_model_unpriced() -> None:
    samples = [text(10.0 + p, p, 2 * p) for p in range(100, 2100, 100)]
    assert fit_model(samples, 20) is None


def test_failed_untimed_and_zero_work_samples_are_ignored() -> None:
    good = [image(1000.0, 100.0)] * 19
    noise = [
        image(1000.0, 100.0, status="backend_error"),
        image(0.0, 100.0),
        image(1000.0, 0.0),
        RequestSample("flux", "image", (1.0, 2.0), 1000.0, "ok", 1),  # wrong arity
    ]
    assert fit_model(good + noise, 20) is None
    assert fit_model([*good, image(1000.0, 100.0)], 20) is not None


def test_min_samples_has_a_floor_of_two() -> None:
    assert fit_model([image(1000.0, 100.0)], 1) is None
    assert fit_model([image(1000.0, 100.0)] * 2, 1) is not None


def test_prediction_needs_matching_arity_and_clamps_negative_work() -> None:
    cost = ModelCost("chat", "llm", 100.0, (1.0, 10.0), 20)
    assert predict(cost, (5.0,)) is None
    assert predict(None, (5.0, 1.0)) is None
    assert predict(cost, (-5.0, 2.0)) == pytest.approx(120.0)
    assert predict_queue(cost, 0, (0.0, 0.0)) == 0.0
    assert predict_queue(cost, 2, (10.0, 3.0)) == pytest.approx(240.0)


@settings(max_examples=50, deadline=None)
@given(
    base=st.floats(0, 5000),
    slope_in=st.floats(0.01, 5),
    slope_out=st.floats(1, 100),
    n=st.integers(20, 60),
)
def test_least_squares_recovers_any_exact_linear_costs(
    base: float, slope_in: float, slope_out: float, n: int
) -> None:
    samples = [
        text(base + slope_in * p + slope_out * o, p, o)
        for p, o in [(50 + 31 * i, 5 + (i * 13) % 41) for i in range(n)]
    ]
    cost = fit_model(samples, 20)
    assert cost is not None
    assert cost.base_ms == pytest.approx(base, abs=1e-3 * max(1.0, base))
    assert cost.slopes_ms == pytest.approx((slope_in, slope_out), rel=1e-4)


# -- loads ----------------------------------------------------------------------------------------------


def test_load_cost_is_the_mean_of_successful_loads_per_config() -> None:
    loads = [load(10_000), load(20_000), load(25_000), load(21_000), load(99_000, status="timeout")]
    loads.append(load(3_000, "other.kcpps"))
    costs = fit_loads(loads)
    assert [(c.config_filename, c.load_ms, c.samples) for c in costs] == [
        ("b.kcpps", 19_000.0, 4),
        ("other.kcpps", 3_000.0, 1),
    ]


def test_loads_never_followed_by_a_generation_still_count() -> None:
    costs = fit_node([], [load(7_000, "helper-only.kcpps")], LendingSettings())
    assert costs.models == ()
    assert [c.config_filename for c in costs.loads] == ["helper-only.kcpps"]


# -- fit_node -------------------------------------------------------------------------------------------


def test_fit_node_prices_text_and_image_per_model_and_skips_speech() -> None:
    samples = [image(1000.0 + i, 200.0 + 10 * i, model="flux") for i in range(20)]
    samples += [text(10.0 + p, p, 5 + p % 7, model="chat") for p in range(100, 120)]
    samples += [RequestSample("whisper", "stt", (30.0,), 1000.0, "ok", 1000) for _ in range(20)]
    costs = fit_node(samples, [], LendingSettings())
    assert [(c.model_id, c.section) for c in costs.models] == [("chat", "llm"), ("flux", "image")]


def test_fit_node_keeps_only_samples_inside_the_window() -> None:
    settings_ = LendingSettings(scheduling_sample_window=60.0)
    old = [image(1000.0, 100.0, at=0)] * 20
    fresh = [image(1000.0, 100.0, at=100_000)] * 20
    assert fit_node(old, [load(5.0, at=0)], settings_, now_ms=100_000) == fit_node([], [], settings_)
    assert len(fit_node(fresh, [], settings_, now_ms=100_000).models) == 1
    assert len(fit_node(old, [], settings_).models) == 1  # no clock: the caller already windowed


# -- token profiles -------------------------------------------------------------------------------------


def test_token_profile_is_pulled_conservative_by_its_own_spread() -> None:
    samples = [text(100.0, 100.0, out, body=body) for body, out in [(400, 10), (500, 20)] * 10]
    profile = fit_token_profile(samples, 20)
    assert profile is not None
    ratios = [4.0, 5.0] * 10
    mean, sd = sum(ratios) / 20, _stdev(ratios)
    assert profile.conservative_bytes_per_token == pytest.approx(mean - 2 * sd)
    assert profile.reserved_output_tokens == math.ceil(15 + 2 * _stdev([10.0, 20.0] * 10))
    assert profile.samples == 20


def test_token_profile_ratio_has_a_floor_and_a_plausible_range() -> None:
    wide = [text(100.0, 100.0, 10, body=b) for b in (60, 600)] * 10  # mean 3.3, σ large
    profile = fit_token_profile(wide, 20)
    assert profile is not None and profile.conservative_bytes_per_token == 0.5
    assert fit_token_profile([text(100.0, 10.0, 10, body=1000)] * 20, 20) is None  # 100 bytes/token
    assert fit_token_profile([text(100.0, 100.0, 10, body=0)] * 20, 20) is None  # no sizes


def test_the_lenient_size_line_tells_a_bodys_fixed_bytes_from_its_bytes_per_token() -> None:
    """Bodies of 60 fixed bytes plus 2 bytes a token: one ratio spreads (a short body looks like many
    bytes a token), the line does not, and its fewest tokens for a long body are close below the truth."""
    samples = [text(100.0, p, 10, body=60 + 2 * p + (p % 3)) for p in (10, 40, 90, 150, 220, 300) * 4]
    profile = fit_token_profile(samples, 20)
    assert profile is not None
    assert profile.overhead_bytes == pytest.approx(61, abs=3)
    assert profile.marginal_bytes_per_token == pytest.approx(2.0, abs=0.05)
    fewest = fewest_prompt_tokens(profile, 60 + 2 * 1000)
    assert fewest is not None and 950 <= fewest <= 1000
    assert fewest_prompt_tokens(profile, 10) == 0
    assert fewest_prompt_tokens(None, 1000) is None


def test_without_spread_in_token_counts_the_lenient_size_is_the_mean_ratio_plus_two_sigma() -> None:
    samples = [text(100.0, 100.0, 10, body=b) for b in (380, 420)] * 10
    profile = fit_token_profile(samples, 20)
    assert profile is not None and profile.overhead_bytes == 0.0
    assert profile.marginal_bytes_per_token == pytest.approx(4.0 + 2 * _stdev([3.8, 4.2] * 10))
    assert fewest_prompt_tokens(TokenProfile("chat", 4.0, 300, 20), 4000) is None  # a node predating it


def test_token_profile_needs_min_samples() -> None:
    assert fit_token_profile([text(100.0, 100.0, 10, body=400)] * 19, 20) is None


def test_fit_node_publishes_token_profiles_for_text_models() -> None:
    samples = [text(10.0 + p, p, 5 + p % 7, body=4 * p) for p in range(100, 120)]
    costs = fit_node(samples, [], LendingSettings())
    assert [t.model_id for t in costs.tokens] == ["chat"]


def test_text_size_estimate_uses_the_client_limit_or_the_larger_reserve() -> None:
    profile = TokenProfile("chat", 4.0, 300, 20)
    assert estimate_text(profile, 4001, 50, 256) == ((1001.0, 50.0), 1051)
    assert estimate_text(profile, 4000, None, 256) == ((1000.0, 300.0), 1300)
    assert estimate_text(profile, 4000, None, 512) == ((1000.0, 300.0), 1512)  # works 300, reserves 512


def test_a_limit_above_the_measured_answers_reserves_context_but_prices_the_measured_work() -> None:
    """A model that answers in 10 tokens (measured) asked with max_tokens 20: the context must hold
    20, the work is 10, so the uniform fit of those same requests (10 output tokens) prices them."""
    profile = TokenProfile("chat", 2.0, 10, 6)
    (prompt, output), context = estimate_text(profile, 96, 20, 16) or ((0.0, 0.0), 0)
    assert (prompt, output, context) == (48.0, 10.0, 68)
    fit = fit_model([text(150.0 + i, 48.0, 10.0) for i in range(6)], 2)
    assert fit is not None and fit.uniform_work == (48.0, 10.0)
    assert predict(fit, (prompt, output)) == pytest.approx(152.5)
    assert estimate_text(None, 4000, None, 256) is None
    assert estimate_text(profile, 0, None, 256) is None


def _stdev(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@pytest.mark.parametrize(("body", "limit"), [
    ({"max_tokens": 40}, 40),
    ({"max_completion_tokens": 41}, 41),
    ({"max_output_tokens": 42}, 42),  # the Responses API
    ({"n_predict": 43}, 43),  # llama.cpp /completion
    ({"options": {"num_predict": 44}}, 44),  # Ollama
    ({"max_length": 45}, 45),  # Kobold
    ({"max_tokens": 0, "max_output_tokens": 46}, 46),  # the first *positive* one wins
    ({"max_tokens": 47, "options": {"num_predict": 9}}, 47),  # in the reference's order
    ({"n_predict": -1, "options": {"num_predict": 48}}, 48),
    ({"max_tokens": True, "max_output_tokens": "50"}, None),  # not integers
    ({"options": {"num_predict": -1}}, None),  # Ollama's "unlimited"
    ({"options": "num_predict"}, None),
    ({}, None),
    (None, None),
])
def test_client_output_limit_reads_every_dialects_key(body: dict[str, object] | None,
                                                      limit: int | None) -> None:
    assert client_output_limit(body) == limit


# -- robust fit and conservative pricing (issue 13 item 6) -------------------------------------------------


def _jittered_line(outlier_at: int | None = None) -> list[RequestSample]:
    """20 image samples on ``500 + 0.002·work`` ms with ±1 % deterministic jitter; one 10× when asked."""
    out = []
    for i, w in enumerate(range(1_000_000, 5_000_000, 200_000)):
        ms = (500.0 + 0.002 * w) * (1.0 + 0.01 * ((i * 7) % 5 - 2) / 2)
        out.append(image(ms * (10.0 if i == outlier_at else 1.0), float(w)))
    return out


def test_one_10x_outlier_among_20_samples_moves_the_ols_price_and_not_the_robust_one() -> None:
    """A swap or a cold cache makes one job 10× slower: least squares drags the whole line with it,
    Huber's T down-weights it."""
    import numpy as np

    from routerd.lending.pricing import linear_fit

    def price(samples: list[RequestSample], robust: bool) -> float:
        work = np.array([s.work for s in samples])
        duration = np.array([s.duration_ms for s in samples])
        fit = linear_fit(work, duration, robust=robust)
        assert fit is not None
        return fit.base + fit.slopes[0] * 3_000_000  # a mid-size job, clean price ≈ 6,500 ms

    clean = _jittered_line()
    spoiled = _jittered_line(outlier_at=10)
    clean_price = price(clean, robust=False)
    assert clean_price == pytest.approx(6500.0, rel=0.01)
    assert price(spoiled, robust=False) > 1.2 * clean_price  # OLS: more than 20 % dearer
    assert price(spoiled, robust=True) == pytest.approx(clean_price, rel=0.01)  # robust: within 1 %
    # and fit_model (robust by default) publishes that robust price
    cost = fit_model(spoiled, 20)
    assert cost is not None and predict(cost, (3_000_000.0,)) == pytest.approx(clean_price, rel=0.02)


def test_published_coefficients_are_raised_by_one_standard_error() -> None:
    """Scatter makes a price conservative: each coefficient is the fit plus one standard error, so
    noisier samples of the same line price higher, and samples on a line price exactly."""
    import numpy as np

    from routerd.lending.pricing import CONSERVATIVE_SIGMAS, linear_fit

    samples = _jittered_line()
    fit = linear_fit(np.array([s.work for s in samples]), np.array([s.duration_ms for s in samples]))
    assert fit is not None and fit.robust and fit.base_se > 0 and fit.slopes_se[0] > 0
    cost = fit_model(samples, 20)
    assert cost is not None
    assert cost.base_ms == pytest.approx(fit.base + CONSERVATIVE_SIGMAS * fit.base_se)
    assert cost.slopes_ms[0] == pytest.approx(fit.slopes[0] + CONSERVATIVE_SIGMAS * fit.slopes_se[0])
    exact = fit_model([image(500.0 + 0.002 * w, w) for w in range(1_000_000, 5_000_000, 200_000)], 20)
    assert exact is not None
    assert predict(cost, (3_000_000.0,)) > predict(exact, (3_000_000.0,))  # type: ignore[operator]

