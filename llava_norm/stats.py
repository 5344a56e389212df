"""Uncertainty for benchmark scores: bootstrap intervals, paired arm deltas, seeds, chance tests.

Owns the statistics the demo report and the results table share, so both say the same thing
about the same numbers. A benchmark's result for one model is a set of *units* (items or item
groups), each a row of numbers: a float array of shape ``(n_units, k)``. A *statistic* maps the
rows of (a resample of) units to the headline score, e.g. ``mean_of(0)`` for accuracy or an F1
computed from column sums. It provides ``bootstrap_interval`` (one model, over units),
``paired_bootstrap`` / ``seed_paired_bootstrap`` (arm B minus arm A on the same units, in one
training seed or hierarchically over seeds), ``mean_over_seeds`` (Student-t over per-seed
scores) and ``chance_test`` / ``chance_test_units`` (above chance, one chance level or one per
unit), with their building blocks ``t_quantile``, ``wilson_interval`` and ``binomial_tail``.

Randomness comes only from the ``seed`` argument, so every result is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Statistic = Callable[[np.ndarray], float]
# Resample indices are drawn in blocks of at most this many entries: vectorised, but bounded
# memory for thousands of units x thousands of resamples x several seeds.
_BLOCK_ENTRIES = 1 << 22


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval; ``note`` says why bounds may be infinite."""

    estimate: float
    low: float
    high: float
    level: float = 0.95
    note: str = ""

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    def format(self, scale: float = 1.0, digits: int = 1) -> str:
        """``"38.0 [30.1, 45.9]"``, or ``"38.0 (<note>)"`` when there is no finite interval."""
        est = f"{self.estimate * scale:.{digits}f}"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{est} ({self.note or 'no interval'})"
        return f"{est} [{self.low * scale:.{digits}f}, {self.high * scale:.{digits}f}]"


@dataclass(frozen=True)
class Delta:
    """Difference ``stat(b) - stat(a)`` between two arms, with interval and two-sided p-value."""

    estimate: float
    low: float
    high: float
    p_value: float
    level: float
    n_units: int
    n_seeds: int

    @property
    def covers_zero(self) -> bool:
        return self.low <= 0.0 <= self.high

    @property
    def verdict(self) -> str:
        """B relative to A: "no detectable difference" when the interval covers 0."""
        if self.covers_zero:
            return "no detectable difference"
        return "higher" if self.estimate > 0 else "lower"

    @property
    def scope(self) -> str:
        seeds = "one training seed" if self.n_seeds == 1 else f"{self.n_seeds} training seeds"
        return f"{self.n_units} units, {seeds}"

    def format(self, scale: float = 1.0, digits: int = 1) -> str:
        """``"+5.0 [+1.2, +8.8], p=0.004 (300 units, one training seed)"``."""
        p = "p<0.001" if self.p_value < 0.001 else f"p={self.p_value:.3f}"
        lo, hi = self.low * scale, self.high * scale
        return f"{self.estimate * scale:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}], {p} ({self.scope})"


@dataclass(frozen=True)
class MeanOf:
    """Statistic "mean of one column" (accuracy); the bootstrap spots it and runs it as one gather."""

    column: int = 0

    def __call__(self, rows: np.ndarray) -> float:
        return float(np.mean(rows[:, self.column]))


mean_of = MeanOf  # ``mean_of(0)`` reads as what it computes


def _as_rows(rows) -> np.ndarray:
    arr = np.asarray(rows, dtype=float)
    arr = arr[:, None] if arr.ndim == 1 else arr  # a 1-D score list is one column per unit
    if arr.ndim != 2 or len(arr) == 0:
        raise ValueError(f"rows must be a non-empty (n_units, k) array, got shape {arr.shape}")
    return arr


def _same_units(blocks: Sequence[np.ndarray], counts) -> int:
    """The unit count every seed (and arm) shares. One benchmark scores the same units in every
    run, so a mismatch means missing results; the resampling would also index past the shorter
    seeds' rows, or silently ignore the longer ones' extra units."""
    n = len(blocks[0])
    if any(len(rows) != n for rows in blocks):
        raise ValueError(f"every seed and arm must score the same units, got counts {counts}")
    return n


def _resample(arms: Sequence[Sequence[np.ndarray]], statistic: Statistic, resamples: int, seed: int) -> np.ndarray:
    """Bootstrap draws of ``statistic`` for each arm, shape ``(n_arms, resamples)``.

    ``arms[a][s]`` holds arm ``a``'s rows for training seed ``s``. A resample draws seeds with
    replacement (only when there are several), then units within each drawn seed, and averages
    the statistic over drawn seeds. Every arm uses the same draws, which is what pairs them."""
    rng = np.random.default_rng(seed)
    n_seeds, n = len(arms[0]), len(arms[0][0])
    per_block = max(1, _BLOCK_ENTRIES // (n_seeds * n))
    if isinstance(statistic, MeanOf):  # each arm's column, seeds concatenated: one flat gather
        cols = [np.concatenate([rows[:, statistic.column] for rows in arm]) for arm in arms]
    out = np.empty((len(arms), resamples))
    for start in range(0, resamples, per_block):
        m = min(per_block, resamples - start)
        seeds = rng.integers(0, n_seeds, size=(m, n_seeds)) if n_seeds > 1 else np.zeros((m, 1), dtype=np.int64)
        units = rng.integers(0, n, size=(m, seeds.shape[1], n))
        flat = seeds[..., None] * n + units if isinstance(statistic, MeanOf) else None
        for a, arm in enumerate(arms):
            if flat is not None:
                stats = cols[a].take(flat).mean(axis=-1)
            else:  # any callable: one call per (resample, drawn seed)
                stats = np.array([[statistic(arm[s][u]) for s, u in zip(ss, uu, strict=True)]
                                  for ss, uu in zip(seeds, units, strict=True)])
            out[a, start:start + m] = stats.mean(axis=1)
    return out


def bootstrap_interval(rows, statistic: Statistic, *, level: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> Interval:
    """Percentile bootstrap interval for ``statistic`` over units; the estimate is on all units."""
    rows = _as_rows(rows)
    low, high = np.quantile(_resample([[rows]], statistic, resamples, seed)[0], [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(statistic(rows)), float(low), float(high), level)


def paired_bootstrap(rows_a, rows_b, statistic: Statistic, *, level: float = 0.95, resamples: int = 2000,
                     seed: int = 0) -> Delta:
    """``stat(b) - stat(a)`` for two arms scored on the same units (row i of each is unit i).

    Each resample draws one index array used for both arms, so per-unit difficulty cancels and
    the interval is much narrower than comparing two independent intervals."""
    return seed_paired_bootstrap([(rows_a, rows_b)], statistic, level=level, resamples=resamples, seed=seed)


def seed_paired_bootstrap(pairs, statistic: Statistic, *, level: float = 0.95, resamples: int = 2000,
                          seed: int = 0) -> Delta:
    """Arm delta over training seeds: ``pairs[s] = (rows_a, rows_b)`` for seed ``s``.

    Hierarchical bootstrap: draw seeds with replacement, then units within each drawn seed
    (paired within the seed); the delta is the mean over drawn seeds. With one seed this is the
    paired bootstrap. With 2-3 seeds a bootstrap of the seed level can only show the spread
    those seeds happen to have, and under-covers where seeds differ more than items do (a 95%
    interval held the truth 81% of the time with 3 seeds in tests/test_stats.py's setting). So
    with several seeds the interval is widened to hold Student's t interval of the per-seed
    deltas (df = seeds - 1), and the p-value is the larger of the two: nominal when either
    level dominates, conservative in between."""
    pairs = [(_as_rows(a), _as_rows(b)) for a, b in pairs]
    if not pairs:
        raise ValueError("no seeds given")
    n = _same_units([rows for pair in pairs for rows in pair], [(len(a), len(b)) for a, b in pairs])
    draws = _resample([[a for a, _ in pairs], [b for _, b in pairs]], statistic, resamples, seed)
    deltas = draws[1] - draws[0]
    low, high = np.quantile(deltas, [(1 - level) / 2, (1 + level) / 2])
    # Two-sided bootstrap p-value: twice the smaller share of resampled deltas on either side of
    # 0, each share counted as (count + 1) / (resamples + 1) so a finite bootstrap never claims
    # p = 0 (the floor is 2 / (resamples + 1)). A resampled delta of exactly 0 counts half on
    # each side (mid-p), so identical arms give p = 1 but a delta that is 0 in most resamples
    # of a few discrete units does not.
    ties = int(np.sum(deltas == 0))
    side = min(int(np.sum(deltas < 0)), int(np.sum(deltas > 0))) + ties / 2
    p_value = min(1.0, 2 * (side + 1) / (resamples + 1))
    per_seed = np.array([statistic(b) - statistic(a) for a, b in pairs])
    estimate = float(per_seed.mean())
    if len(pairs) > 1:
        t_interval = mean_over_seeds(per_seed, level)
        low, high = min(low, t_interval.low), max(high, t_interval.high)
        spread = float(per_seed.std(ddof=1))
        t_p = t_two_sided_p(estimate / (spread / math.sqrt(len(pairs))), len(pairs) - 1) if spread > 0 else float(
            estimate == 0)
        p_value = max(p_value, t_p)
    return Delta(estimate, float(low), float(high), p_value, level, n, len(pairs))


def _t_central(theta: float, nu: int) -> float:
    """P(|T| <= sqrt(nu) tan(theta)) for Student's t with integer ``nu``: a series in cos^2."""
    even = nu % 2 == 0
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    term = total = 1.0 if even else math.cos(theta) if nu > 1 else 0.0
    for j in range(1, nu // 2):
        term *= c2 * (2 * j - even) / (2 * j + 1 - even)
        total += term
    return s * total if even else 2 / math.pi * (theta + s * total)


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of a t statistic with integer ``df``: P(|T| >= |t|)."""
    if df != int(df) or df < 1:
        raise ValueError(f"df must be a positive integer, got {df}")
    return max(0.0, 1.0 - _t_central(math.atan(abs(t) / math.sqrt(df)), int(df)))


def seeds_interval(rows_per_seed, statistic: Statistic, *, level: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> Interval:
    """One arm's score over training seeds: the mean of the per-seed scores, with the union of
    Student's t interval over the seeds and a hierarchical bootstrap (seeds, then units within
    each), so that neither the seeds' spread nor the units' is left out (identical seeds still
    have item noise). One seed: the bootstrap over units alone."""
    rows = [_as_rows(r) for r in rows_per_seed]
    if not rows:
        raise ValueError("no seeds given")
    _same_units(rows, [len(r) for r in rows])
    if len(rows) == 1:
        return bootstrap_interval(rows[0], statistic, level=level, resamples=resamples, seed=seed)
    draws = _resample([rows], statistic, resamples, seed)[0]
    low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    t = mean_over_seeds([statistic(r) for r in rows], level)
    return Interval(t.estimate, min(float(low), t.low), max(float(high), t.high), level)


def t_quantile(prob: float, df: float) -> float:
    """Quantile of Student's t with integer ``df`` (``math.inf`` gives the normal quantile).

    Exact up to float precision: bisection on the closed-form CDF for integer df (Abramowitz &
    Stegun 26.7.3-4, in terms of theta = atan(t / sqrt(df))); df > 300 uses the Cornish-Fisher
    expansion (next term dropped: about 1e-10 at the 97.5% point)."""
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob must be in (0, 1), got {prob}")
    if prob < 0.5:
        return -t_quantile(1.0 - prob, df)
    z = NormalDist().inv_cdf(prob)
    if math.isinf(df):
        return z
    if df != int(df) or df < 1:
        raise ValueError(f"df must be a positive integer or math.inf, got {df}")
    nu = int(df)
    if nu > 300:
        z2 = z * z
        return (z + z * (z2 + 1) / (4 * nu) + z * ((5 * z2 + 16) * z2 + 3) / (96 * nu**2)
                + z * (((3 * z2 + 19) * z2 + 17) * z2 - 15) / (384 * nu**3))

    target, lo, hi = 2 * prob - 1, 0.0, math.pi / 2
    for _ in range(80):  # the CDF rises monotonically in theta; 80 halvings reach float precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central(mid, nu) < target else (lo, mid)
    return math.sqrt(nu) * math.tan((lo + hi) / 2)


def mean_over_seeds(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean of per-seed scores with a Student-t interval (df = seeds - 1).

    One seed says nothing about seed-to-seed spread, so its interval is (-inf, inf) with a note,
    rather than a zero-width interval that would look certain."""
    vals = np.asarray(values, dtype=float)
    if vals.size == 0:
        raise ValueError("no values")
    mean = float(vals.mean())
    if vals.size == 1:
        return Interval(mean, -math.inf, math.inf, level, note="one seed, no interval")
    half = t_quantile((1 + level) / 2, vals.size - 1) * float(vals.std(ddof=1)) / math.sqrt(vals.size)
    return Interval(mean, mean - half, mean + half, level)


def wilson_interval(k: int, n: int, level: float = 0.95) -> Interval:
    """Wilson score interval for a proportion k/n (sane at 0, n and small n, unlike Wald)."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    z = NormalDist().inv_cdf((1 + level) / 2)
    p, z2 = k / n, z * z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # At k = 0 or k = n the bound is exactly 0 or 1; the formula only gets there up to rounding.
    low, high = (0.0 if k == 0 else center - half), (1.0 if k == n else center + half)
    return Interval(p, low, high, level)


def binomial_tail(k: int, n: int, p: float) -> float:
    """Exact P[X >= k] for X ~ Binomial(n, p), summed in log space so large n does not underflow."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    i = np.arange(k, n + 1)
    steps = np.log(np.arange(n, 0, -1)) - np.log(np.arange(1, n + 1))  # log C(n,i) - log C(n,i-1)
    log_comb = np.concatenate([[0.0], np.cumsum(steps)])[i]
    logs = log_comb + i * math.log(p) + (n - i) * math.log1p(-p)
    top = logs.max()
    return float(min(1.0, math.exp(top) * np.exp(logs - top).sum()))


@dataclass(frozen=True)
class ChanceVerdict:
    """One-sided test of "better than chance"; ``margin`` = Wilson 95% low end minus chance."""

    k: int
    n: int
    chance: float  # the mean chance level when it differs per unit
    p_value: float
    verdict: str  # "above chance" | "borderline" | "not above chance"
    margin: float


def _verdict(k: int, n: int, chance: float, p_value: float, clear: float, borderline: float) -> ChanceVerdict:
    verdict = "above chance" if p_value < clear else "borderline" if p_value < borderline else "not above chance"
    return ChanceVerdict(k, n, chance, p_value, verdict, wilson_interval(k, n).low - chance)


def chance_test(k: int, n: int, chance: float, *, clear: float = 0.01, borderline: float = 0.05) -> ChanceVerdict:
    """Is k correct out of n above a single chance level? Exact binomial tail P[X >= k]."""
    return _verdict(k, n, chance, binomial_tail(k, n, chance), clear, borderline)


def chance_test_units(correct, chances, *, clear: float = 0.01, borderline: float = 0.05) -> ChanceVerdict:
    """Above-chance test when chance differs per unit (e.g. 3- and 4-option items).

    Under chance the number correct is Poisson-binomial, not Binomial(n, mean chance) (that one
    is too wide), so its tail is computed exactly by dynamic programming over units: O(n^2),
    fine for a few thousand units. A true tail below ~1e-300 underflows to p = 0."""
    correct, chances = np.asarray(correct, dtype=float).ravel(), np.asarray(chances, dtype=float).ravel()
    if correct.shape != chances.shape or correct.size == 0:
        raise ValueError("correct and chances must be non-empty and of equal length")
    pmf = np.zeros(correct.size + 1)
    pmf[0] = 1.0
    for m, q in enumerate(chances, start=1):  # pmf of the count after m units
        pmf[1:m + 1] = pmf[1:m + 1] * (1 - q) + pmf[:m] * q
        pmf[0] *= 1 - q
    k = round(float(correct.sum()))
    p_value = float(min(1.0, pmf[k:].sum()))
    return _verdict(k, correct.size, float(chances.mean()), p_value, clear, borderline)
