"""Cost fits a node makes of its own measured requests and loads (lending reference §5, §6).

Pure functions: samples in, coefficients out.  Fitting is CPU work (statsmodels), so the node runs
:func:`fit_node` off the reactor thread and publishes the resulting :class:`Costs` in its status;
the master only reads coefficients and calls :func:`predict` / :func:`predict_queue`.

Rules:

* A request sample counts when it succeeded, took a positive time and every work term is positive.
* A model is priced once it has ``scheduling_min_samples`` (at least 2) such samples.
* Spread test per work term: its coefficient of variation is at least 5 %
  (``n·Σx² − (Σx)² ≥ (0.05·Σx)²``).  Every term without spread → a *uniform* estimate (mean duration,
  valid only within ±10 % per term of the mean work); otherwise a robust linear fit ``duration = base
  + Σ slope_i·work_i`` of the terms with spread (statsmodels ``RLM`` with Huber's T, so a few outliers
  — a swap, a cold cache — do not skew the price; ordinary least squares when the samples lie on a
  line), unpriced when a slope is negative or not finite, or the terms are collinear; a negative base
  becomes 0.  A term without spread beside terms with it (a model whose answers are all one length,
  asked prompts of every length) has slope 0, its cost in the base, and prices only work within ±10 %
  of its mean, as a uniform term does: ``uniform_work`` holds its mean and 0 for each fitted term.
  Each published coefficient is the fitted one plus ``CONSERVATIVE_SIGMAS`` of its standard error, so
  a model measured with scatter (or few samples) is priced conservatively.
* Loads: the mean duration of every successful load per config file, whether or not a generation
  followed it.

A request is priced by its work terms (:func:`work_terms`): read off an image request's body, or
estimated for a text request from its size and the model's bytes-per-token profile.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from routerd.config.lending import LendingSettings
from routerd.routing.call import Call
from routerd.routing.work import request_work
from routerd.store.samples import OK, LoadSample, RequestSample
from routerd.wire.lending import Costs, Lane, LoadCost, ModelCost, TokenProfile

if TYPE_CHECKING:
    import numpy as np

# numpy and statsmodels are imported by the first fit, never at start: statsmodels alone is most of a
# node's start time and idle memory, and a node fits off the reactor thread (Node.refresh_costs).

#: Sections that are priced, with the number of work terms their samples carry.
PRICED_SECTIONS: dict[str, int] = {"llm": 2, "image": 1}
#: Coefficient of variation below which a work term counts as having no spread.
SPREAD_FLOOR = 0.05
#: A uniform fit prices work within this fraction of its mean work, per term.
UNIFORM_TOLERANCE = 0.10
#: Token profile: plausible mean bytes per prompt token, and the conservative margin in σ.
MIN_BYTES_PER_TOKEN = 0.5
MAX_BYTES_PER_TOKEN = 64.0
PROFILE_SIGMAS = 2.0
#: The lowest ``min_samples`` any fit accepts.
MIN_SAMPLES_FLOOR = 2
#: Published coefficients are the fitted ones plus this many standard errors.
CONSERVATIVE_SIGMAS = 1.0
#: Residual scale (relative to the mean duration) below which samples count as lying on a line.
EXACT_FIT_SCALE = 1e-9


def usable(sample: RequestSample, terms: int | None = None) -> bool:
    """Whether a request sample may feed a cost fit (successful, timed, positive work)."""
    if sample.status != OK or not sample.duration_ms > 0 or not sample.work:
        return False
    if terms is not None and len(sample.work) != terms:
        return False
    return all(w > 0 and math.isfinite(w) for w in sample.work) and math.isfinite(sample.duration_ms)


def has_spread(values: Sequence[float]) -> bool:
    """The spread test of one work term: ``n·Σx² − (Σx)² ≥ (0.05·Σx)²`` with ``Σx > 0``."""
    n = len(values)
    total = math.fsum(values)
    if total <= 0:
        return False
    squares = math.fsum(v * v for v in values)
    return n * squares - total * total >= (SPREAD_FLOOR * total) ** 2


def fit_model(samples: Sequence[RequestSample], min_samples: int) -> ModelCost | None:
    """Fit one (model, section) from its samples, or None when it stays unpriced.

    All samples must share model and section (the first one names the fit); samples that are
    unusable or whose term count differs from the section's (or from the first sample's, for an
    unpriced section) are ignored.
    """
    if not samples:
        return None
    model_id, section = samples[0].model_id, samples[0].section
    terms = PRICED_SECTIONS.get(section, len(samples[0].work))
    rows = [s for s in samples if usable(s, terms)]
    if terms <= 0 or len(rows) < max(min_samples, MIN_SAMPLES_FLOOR):
        return None
    import numpy as np

    work = np.array([s.work for s in rows], dtype=float)
    duration = np.array([s.duration_ms for s in rows], dtype=float)
    spread = [has_spread(work[:, i].tolist()) for i in range(terms)]
    if not any(spread):
        return ModelCost(
            model_id=model_id,
            section=section,
            base_ms=float(duration.mean()),
            slopes_ms=(0.0,) * terms,
            samples=len(rows),
            uniform_work=tuple(float(m) for m in work.mean(axis=0)),
        )
    varied = [i for i in range(terms) if spread[i]]
    fitted = linear_fit(work[:, varied], duration)
    if fitted is None:
        return None
    base, fitted_slopes = fitted.conservative()
    slopes = [0.0] * terms
    for i, slope in zip(varied, fitted_slopes, strict=True):
        slopes[i] = slope
    means = work.mean(axis=0)
    held = None if all(spread) else tuple(0.0 if spread[i] else float(means[i]) for i in range(terms))
    return ModelCost(model_id=model_id, section=section, base_ms=max(base, 0.0), slopes_ms=tuple(slopes),
                     samples=len(rows), uniform_work=held)


class LinearFit:
    """A fitted ``duration = base + Σ slope_i·work_i`` with each coefficient's standard error."""

    __slots__ = ("base", "slopes", "base_se", "slopes_se", "robust")

    def __init__(self, base: float, slopes: tuple[float, ...], base_se: float,
                 slopes_se: tuple[float, ...], robust: bool) -> None:
        self.base = base
        self.slopes = slopes
        self.base_se = base_se
        self.slopes_se = slopes_se
        self.robust = robust

    def conservative(self, sigmas: float = CONSERVATIVE_SIGMAS) -> tuple[float, tuple[float, ...]]:
        """``(base, slopes)`` each raised by ``sigmas`` standard errors."""
        return (self.base + sigmas * self.base_se,
                tuple(s + sigmas * se for s, se in zip(self.slopes, self.slopes_se, strict=True)))


def _finite_or_zero(value: float) -> float:
    return value if math.isfinite(value) and value > 0 else 0.0


def linear_fit(work: np.ndarray, duration: np.ndarray, *, robust: bool = True) -> LinearFit | None:
    """Fit of ``duration`` on a constant and each work column, or None (collinear, negative slope).

    ``robust`` fits by ``RLM`` with Huber's T (ordinary least squares when the residuals are all
    but zero: the samples lie on a line and there is nothing to down-weight); otherwise by OLS.
    """
    import numpy as np
    import statsmodels.api as sm

    scale = work.mean(axis=0)  # columns scaled to ~1 so wide ranges (pixels vs ms) stay well conditioned
    design = sm.add_constant(work / scale, has_constant="add")
    if np.linalg.matrix_rank(design) < design.shape[1]:
        return None
    result: Any = sm.OLS(duration, design).fit()
    used_robust = False
    if robust:
        spread = float(np.median(np.abs(result.resid - np.median(result.resid))))
        if spread > EXACT_FIT_SCALE * max(float(np.mean(np.abs(duration))), 1.0):
            result = sm.RLM(duration, design, M=sm.robust.norms.HuberT()).fit()
            used_robust = True
    params = np.asarray(result.params, dtype=float)
    if not np.all(np.isfinite(params)):
        return None
    slopes = params[1:] / scale
    # a slope that is zero but for rounding (-4.6e-14 from an exact fit under numpy 2.4) is zero
    noise = 1e-9 * max(float(np.max(np.abs(params))), 1.0) / scale
    if np.any(slopes < -noise):
        return None
    slopes = np.maximum(slopes, 0.0)
    with np.errstate(all="ignore"):
        errors = np.asarray(result.bse, dtype=float) if result.df_resid > 0 else np.zeros_like(params)
    slope_errors = errors[1:] / scale
    return LinearFit(float(params[0]), tuple(float(s) for s in slopes), _finite_or_zero(float(errors[0])),
                     tuple(_finite_or_zero(float(e)) for e in slope_errors), used_robust)


def _within_uniform(cost: ModelCost, work: Sequence[float]) -> bool:
    """Whether every held term of ``work`` (a positive mean in ``uniform_work``; 0 marks a fitted
    term) is within ±10 % of that mean."""
    assert cost.uniform_work is not None
    return all(
        abs(w - mean) <= UNIFORM_TOLERANCE * mean
        for w, mean in zip(work, cost.uniform_work, strict=True) if mean > 0
    )


def predict(cost: ModelCost | None, work: Sequence[float]) -> float | None:
    """Predicted duration (ms) of one job of ``work``, or None when the fit cannot price it."""
    if cost is None or len(work) != len(cost.slopes_ms):
        return None
    if cost.uniform_work is not None and (
            len(cost.uniform_work) != len(work) or not _within_uniform(cost, work)):
        return None
    total = cost.base_ms
    for slope, w in zip(cost.slopes_ms, work, strict=True):  # one or two terms: a loop, no fsum
        if w > 0:
            total += slope * w
    return total


def predict_queue(cost: ModelCost | None, count: int, total_work: Sequence[float]) -> float | None:
    """Predicted time (ms) to run ``count`` jobs whose work terms sum to ``total_work``.

    A uniform fit prices the queue from its mean work (``count × base`` when the mean is in range).
    """
    if cost is None:
        return None
    if count <= 0:
        return 0.0
    if len(total_work) != len(cost.slopes_ms):
        return None
    if cost.uniform_work is not None:
        mean = [w / count for w in total_work]
        if len(cost.uniform_work) != len(mean) or not _within_uniform(cost, mean):
            return None
    total = count * cost.base_ms
    for slope, w in zip(cost.slopes_ms, total_work, strict=True):  # one or two terms: a loop, no fsum
        if w > 0:
            total += slope * w
    return total


def fit_loads(samples: Iterable[LoadSample]) -> list[LoadCost]:
    """Mean duration of every successful load per config file (sorted by file name)."""
    per_file: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        if sample.status == OK and sample.config_filename and sample.duration_ms > 0:
            per_file[sample.config_filename].append(float(sample.duration_ms))
    return [
        LoadCost(config_filename=name, load_ms=math.fsum(values) / len(values), samples=len(values))
        for name, values in sorted(per_file.items())
    ]


def fit_token_profile(samples: Sequence[RequestSample], min_samples: int) -> TokenProfile | None:
    """A text model's token profile from its ``llm`` samples that carry a request size.

    ``conservative_bytes_per_token`` = mean − 2σ of body bytes per prompt token (at least 0.5; the
    mean must be 0.5…64); ``reserved_output_tokens`` = ⌈mean + 2σ⌉ of output tokens.  The lenient
    size (:func:`fewest_prompt_tokens`) is a line ``bytes = overhead + marginal × tokens`` (a body's
    JSON and a chat template are a fixed cost, which one ratio cannot tell from the text's), both
    raised by 2 standard errors; without spread in the token counts, the mean ratio + 2σ alone.
    """
    rows = [s for s in samples if s.section == "llm" and usable(s, 2) and s.request_bytes > 0]
    if not rows or len(rows) < max(min_samples, MIN_SAMPLES_FLOOR):
        return None
    ratios = [s.request_bytes / s.work[0] for s in rows]
    mean_ratio = statistics.fmean(ratios)
    if not MIN_BYTES_PER_TOKEN <= mean_ratio <= MAX_BYTES_PER_TOKEN:
        return None
    outputs = [s.work[1] for s in rows]
    spread = PROFILE_SIGMAS * statistics.stdev(ratios)
    conservative = max(mean_ratio - spread, MIN_BYTES_PER_TOKEN)
    overhead, marginal = _size_line(rows, min(mean_ratio + spread, MAX_BYTES_PER_TOKEN))
    reserved = statistics.fmean(outputs) + PROFILE_SIGMAS * statistics.stdev(outputs)
    return TokenProfile(
        model_id=rows[0].model_id,
        conservative_bytes_per_token=conservative,
        reserved_output_tokens=math.ceil(reserved - 1e-9),
        samples=len(rows),
        overhead_bytes=overhead,
        marginal_bytes_per_token=marginal,
    )


def _size_line(rows: Sequence[RequestSample], lenient_ratio: float) -> tuple[float, float]:
    """``(overhead bytes, bytes per token)`` of the lenient size line (see :func:`fit_token_profile`)."""
    tokens = [s.work[0] for s in rows]
    if has_spread(tokens):
        import numpy as np

        fitted = linear_fit(np.array([[t] for t in tokens]), np.array([float(s.request_bytes) for s in rows]))
        if fitted is not None and fitted.slopes[0] > 0:
            base, slopes = fitted.conservative(PROFILE_SIGMAS)
            return base, min(slopes[0], MAX_BYTES_PER_TOKEN)
    return 0.0, lenient_ratio


def fit_node(
    request_samples: Iterable[RequestSample],
    load_samples: Iterable[LoadSample],
    settings: LendingSettings,
    now_ms: int | None = None,
) -> Costs:
    """Every cost a node publishes: one fit per priced (model, section), loads, token profiles.

    With ``now_ms`` only samples that finished inside ``scheduling_sample_window`` count (callers
    that already queried by window may leave it out).
    """
    since = None if now_ms is None else now_ms - int(settings.scheduling_sample_window * 1000)
    groups: dict[tuple[str, str], list[RequestSample]] = defaultdict(list)
    for sample in request_samples:
        if sample.section in PRICED_SECTIONS and (since is None or sample.finished_at_ms >= since):
            groups[(sample.model_id, sample.section)].append(sample)
    models: list[ModelCost] = []
    tokens: list[TokenProfile] = []
    for key in sorted(groups):
        fitted = fit_model(groups[key], settings.scheduling_min_samples)
        if fitted is not None:
            models.append(fitted)
        if key[1] == "llm":
            profile = fit_token_profile(groups[key], settings.scheduling_min_samples)
            if profile is not None:
                tokens.append(profile)
    loads = fit_loads(s for s in load_samples if since is None or s.finished_at_ms >= since)
    return Costs(models=tuple(models), loads=tuple(loads), tokens=tuple(tokens))


# -- text size estimates (spec "LLM lending", reference §6) -------------------------------------------


#: Body keys a client states its answer's length limit in, in the order the first positive one wins
#: (reference §6): OpenAI chat/completions, the Responses API, llama.cpp, then Kobold's
#: ``max_length``; Ollama's ``options.num_predict`` is looked up after ``n_predict``.
OUTPUT_LIMIT_KEYS: tuple[str, ...] = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


def client_output_limit(parsed: Mapping[str, Any] | None) -> int | None:
    """The first positive integer output limit the request body states, or None."""
    if parsed is None:
        return None
    for key in OUTPUT_LIMIT_KEYS:
        value = parsed.get(key)
        if _positive_int(value):
            return value
    options = parsed.get("options")
    if isinstance(options, Mapping) and _positive_int(value := options.get("num_predict")):
        return value
    value = parsed.get("max_length")
    return value if _positive_int(value) else None


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def estimate_text(
    profile: TokenProfile | None, body_bytes: int, client_limit: int | None, context_reserve: int
) -> tuple[tuple[float, float], int] | None:
    """``((prompt_tokens, output_tokens), required_context)`` of a text request, or None (unsized).

    Prompt tokens = ⌈body bytes / conservative ratio⌉.  The answer's share of the context is the
    client's limit when it states one, else the larger of the measured reserve and ``context_reserve``
    (the floor applies only when the client states no limit, as the spec says).  The answer's work
    (what a fit prices) is that share capped at the measured reserve: a limit is only a ceiling, and a
    model whose answers stop well short of it (measured: mean + 2σ) does not work to the limit, so a
    fit of its measured work prices the request by what it will do.
    """
    if profile is None or body_bytes <= 0 or profile.conservative_bytes_per_token <= 0:
        return None
    prompt = math.ceil(body_bytes / profile.conservative_bytes_per_token)
    if client_limit is not None and client_limit > 0:
        share = client_limit
    else:
        share = max(profile.reserved_output_tokens, context_reserve)
    measured = profile.reserved_output_tokens
    output = min(share, measured) if measured > 0 else share
    return (float(prompt), float(output)), prompt + share


def fewest_prompt_tokens(profile: TokenProfile | None, body_bytes: int) -> int | None:
    """The fewest prompt tokens a body of ``body_bytes`` plausibly holds by the profile's lenient size
    line (the context gate refuses on it, so it leans low), or None without one."""
    if profile is None or body_bytes <= 0 or profile.marginal_bytes_per_token <= 0:
        return None
    return max(0, math.floor((body_bytes - profile.overhead_bytes) / profile.marginal_bytes_per_token))


def work_terms(call: Call, lane: Lane, profile: TokenProfile | None,
               context_reserve: int) -> tuple[tuple[float, ...], int]:
    """The work terms (and, for text, the context) the queue and the planner price a request by.

    Image: steps × width × height × count from the body.  Text: estimated from the body size and
    the model's measured bytes-per-token ``profile``, with the client's output limit in any
    dialect (:func:`client_output_limit`: OpenAI, Responses API ``max_output_tokens``, llama.cpp,
    Ollama ``options.num_predict``, Kobold); a model with no profile yet has no estimate (it is
    only probed).
    """
    if lane == "image":
        return request_work(call.route, call.parsed, call.body, call.content_type), 0
    if profile is None:
        return (), 0  # no estimate without a profile (:func:`estimate_text`): the body is not read
    estimate = estimate_text(profile, len(call.body), client_output_limit(call.parsed), context_reserve)
    return ((), 0) if estimate is None else estimate


__all__ = [
    "CONSERVATIVE_SIGMAS",
    "LinearFit",
    "OUTPUT_LIMIT_KEYS",
    "PRICED_SECTIONS",
    "SPREAD_FLOOR",
    "UNIFORM_TOLERANCE",
    "client_output_limit",
    "estimate_text",
    "fewest_prompt_tokens",
    "fit_loads",
    "fit_model",
    "fit_node",
    "fit_token_profile",
    "has_spread",
    "linear_fit",
    "predict",
    "predict_queue",
    "usable",
    "work_terms",
]
