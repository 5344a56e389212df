"""llava_norm.stats: planted effects are found, null intervals cover at the nominal rate, and the
exact pieces (binomial and Poisson-binomial tails, Wilson, t quantiles) match known values."""

import itertools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from llava_norm import stats
from llava_norm.stats import (
    _resample,
    Delta,
    Interval,
    binomial_tail,
    bootstrap_interval,
    chance_test,
    chance_test_units,
    mean_of,
    mean_over_seeds,
    paired_bootstrap,
    seed_paired_bootstrap,
    seeds_interval,
    t_quantile,
    t_two_sided_p,
    wilson_interval,
)


def _two_arms(rng, n=300, p_a=0.45, p_b=0.65):
    """0/1 correctness of two arms on the same n items, as (n, 1) rows."""
    return (rng.random((n, 1)) < p_a).astype(float), (rng.random((n, 1)) < p_b).astype(float)


def _f1(rows):
    """F1 from column sums of per-item (tp, fp, fn) counts: not a mean of any per-item value."""
    tp, fp, fn = rows.sum(axis=0)
    return 2 * tp / (2 * tp + fp + fn)


def _column_mean(rows):
    """The mean of column 0 as a plain callable, so the bootstrap takes its general path."""
    return float(rows[:, 0].mean())


# -- planted effects -------------------------------------------------------------------------

def test_planted_effect_is_found_in_one_seed():
    a, b = _two_arms(np.random.default_rng(1))
    d = paired_bootstrap(a, b, mean_of(0), seed=0)
    assert d.estimate == pytest.approx(b.mean() - a.mean())
    assert 0.05 < d.low < d.estimate < d.high < 0.35
    assert not d.covers_zero and d.verdict == "higher"
    assert d.p_value == 2 / 2001  # no resampled delta reached 0: the floor, never p = 0
    assert (d.n_units, d.n_seeds) == (300, 1)
    assert "one training seed" in d.format(scale=100)
    flipped = paired_bootstrap(b, a, mean_of(0), seed=0)
    assert flipped.verdict == "lower" and flipped.estimate == pytest.approx(-d.estimate)


def test_planted_effect_is_found_over_seeds():
    rng = np.random.default_rng(2)
    # Five seeds: with three, Student's t at df = 2 (half-width 4.3 sd / sqrt 3) leaves even
    # this +0.20 effect near p = 0.05, which is what three seeds can say.
    d = seed_paired_bootstrap([_two_arms(rng) for _ in range(5)], mean_of(0), seed=0)
    assert d.n_seeds == 5 and d.n_units == 300
    assert d.verdict == "higher" and d.low > 0.05 and d.p_value < 0.01
    assert "5 training seeds" in d.format()


def test_seed_level_spread_widens_the_interval():
    # Seeds that disagree (true deltas +0.25, 0, +0.05) give a much wider interval than pooling
    # their units as if they came from one seed. Either seed resampling or the t widening alone
    # passes this; the two tests below each catch the loss of one of them.
    rng = np.random.default_rng(3)
    pairs = [_two_arms(rng, p_a=0.5, p_b=0.5 + shift) for shift in (0.25, 0.0, 0.05)]
    hier = seed_paired_bootstrap(pairs, mean_of(0), resamples=1000)
    pooled = paired_bootstrap(np.vstack([a for a, _ in pairs]), np.vstack([b for _, b in pairs]), mean_of(0),
                              resamples=1000)
    assert hier.estimate == pytest.approx(pooled.estimate)
    assert hier.high - hier.low > 1.5 * (pooled.high - pooled.low)


@pytest.mark.parametrize("statistic", [mean_of(0), _column_mean], ids=["fast_path", "general_path"])
def test_the_bootstrap_draws_resample_seeds(statistic):
    # Every unit of a seed scores the same, so resampling units within a seed changes nothing:
    # the draws can vary only if the seeds themselves are drawn with replacement. Without seed
    # resampling every draw is the mean of the five seeds, exactly.
    seeds = [np.full((40, 1), value) for value in (0.1, 0.3, 0.5, 0.7, 0.9)]
    draws = _resample([seeds], statistic, resamples=400, seed=0)[0]
    assert draws.std() == pytest.approx(np.std([0.1, 0.3, 0.5, 0.7, 0.9]) / math.sqrt(5), rel=0.2)
    # both arms take the same seed draws: a constant shift between arms gives a constant delta
    shifted = [s + 0.05 for s in seeds]
    both = _resample([seeds, shifted], statistic, resamples=400, seed=0)
    np.testing.assert_allclose(both[1] - both[0], 0.05)


def test_several_seeds_widen_to_students_t_of_the_per_seed_deltas():
    # Three seeds with no item noise: the bootstrap over 3 seeds shows their spread only as far
    # as three values can (about 0.8 sd / sqrt 3 each way); Student's t at df = 2 reaches
    # 4.3 sd / sqrt 3. The interval must hold the t interval, and the p-value is t's.
    deltas = (0.02, 0.10, 0.18)
    pairs = [(np.zeros((30, 1)), np.full((30, 1), d)) for d in deltas]
    d = seed_paired_bootstrap(pairs, mean_of(0), resamples=2000)
    t = mean_over_seeds(deltas)
    assert d.low <= t.low + 1e-12 and d.high >= t.high - 1e-12
    assert t.low < 0 < d.estimate  # here the t interval, not the bootstrap, is what covers 0
    assert d.covers_zero and d.p_value == pytest.approx(t_two_sided_p(0.10 / (0.08 / math.sqrt(3)), 2))
    one_column = seeds_interval([b for _, b in pairs], mean_of(0))
    assert one_column.low <= t.low + 1e-12 and one_column.high >= t.high - 1e-12


def test_one_seed_is_the_paired_bootstrap():
    a, b = _two_arms(np.random.default_rng(4))
    assert seed_paired_bootstrap([(a, b)], mean_of(0), seed=7) == paired_bootstrap(a, b, mean_of(0), seed=7)


def test_mismatched_units_are_refused():
    a, b = _two_arms(np.random.default_rng(5))
    with pytest.raises(ValueError, match="same units"):
        seed_paired_bootstrap([(a, b), (a[:-1], b[:-1])], mean_of(0))
    for rows in ([a, a[:-1], a], [a[:-1], a]):  # a later seed longer or shorter than the first
        with pytest.raises(ValueError, match="same units"):
            seeds_interval(rows, mean_of(0))


# -- coverage under no effect ----------------------------------------------------------------

def test_bootstrap_interval_covers_true_mean_at_nominal_rate():
    rng = np.random.default_rng(10)
    truth, reps = 0.4, 400
    data = (rng.random((reps, 150, 1)) < truth).astype(float)
    hits = sum(bootstrap_interval(rows, mean_of(0), resamples=500, seed=i).covers(truth) for i, rows in enumerate(data))
    assert 0.91 <= hits / reps <= 0.98


def test_paired_delta_covers_zero_at_nominal_rate_under_no_effect():
    # Items are strongly shared-difficulty (right with prob 0.05 or 0.95 for both arms), so arms
    # resampled independently would give far too wide intervals (coverage ~1) and fail the band.
    rng = np.random.default_rng(11)
    reps, n = 400, 200
    difficulty = np.where(rng.random((reps, n, 1)) < 0.5, 0.05, 0.95)
    a = (rng.random((reps, n, 1)) < difficulty).astype(float)
    b = (rng.random((reps, n, 1)) < difficulty).astype(float)
    deltas = [paired_bootstrap(a[i], b[i], mean_of(0), resamples=500, seed=i) for i in range(reps)]
    assert 0.91 <= np.mean([d.covers_zero for d in deltas]) <= 0.98
    assert 0.02 <= np.mean([d.p_value < 0.05 for d in deltas]) <= 0.09


def _null_seeds(rng, seed_sd, n=300, seeds=3):
    """Two arms with no effect over training seeds: each (seed, arm) shifts every item's chance
    by its own N(0, seed_sd) (seed noise), items share their difficulty across arms and seeds."""
    difficulty = rng.uniform(0.2, 0.8, n)
    chance = lambda: np.clip(difficulty + rng.normal(0, seed_sd), 0, 1)  # noqa: E731
    return [((rng.random(n) < chance()).astype(float), (rng.random(n) < chance()).astype(float))
            for _ in range(seeds)]


def _null_coverage(seed_sd: float) -> tuple[float, list]:
    rng = np.random.default_rng(13)
    deltas = [seed_paired_bootstrap(_null_seeds(rng, seed_sd), mean_of(0), resamples=400, seed=i) for i in range(300)]
    return float(np.mean([d.covers_zero for d in deltas])), deltas


@pytest.mark.parametrize("seed_sd,band", [(0.1, (0.92, 0.98)), (0.0, (0.93, 1.0))])
def test_seed_delta_covers_zero_at_nominal_rate_over_simulated_seeds(seed_sd, band, monkeypatch):
    # Seeds differing more than items do (0.1): the t widening brings 3 seeds to nominal, from
    # what the bootstrap alone covers (checked below). Items dominating (0): nominal or a little
    # conservative.
    covered, deltas = _null_coverage(seed_sd)
    assert band[0] <= covered <= band[1]
    assert np.mean([d.p_value < 0.05 for d in deltas]) <= 0.08
    assert all((d.p_value < 0.05) != d.covers_zero for d in deltas if abs(d.p_value - 0.05) > 0.01)
    if seed_sd:  # the same draws with the t interval made zero-width: the bootstrap alone under-covers
        monkeypatch.setattr(stats, "mean_over_seeds", lambda values, level: stats.Interval(
            float(np.mean(values)), float(np.mean(values)), float(np.mean(values)), level))
        alone, _ = _null_coverage(seed_sd)
        assert alone < 0.88
        readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
        assert (f"the bootstrap alone held a true zero in {alone:.0%} of 95% intervals with 3 seeds, and the "
                f"widened one in {covered:.0%}") in readme


def test_seeds_interval_keeps_item_noise_and_seed_spread():
    rng = np.random.default_rng(21)
    same = (rng.random((200, 1)) < 0.5).astype(float)
    identical = seeds_interval([same, same, same], mean_of(0))  # t alone would be zero-width
    assert identical.low < identical.estimate < identical.high
    spread = [(rng.random((200, 1)) < p).astype(float) for p in (0.3, 0.5, 0.7)]
    joined, t = seeds_interval(spread, mean_of(0)), mean_over_seeds([r.mean() for r in spread])
    assert joined.low <= t.low and joined.high >= t.high and joined.estimate == pytest.approx(t.estimate)


def test_a_delta_that_is_mostly_tied_is_not_given_p_one():
    # Two seeds give identical arms, the third differs on one unit of three: nearly half the
    # resampled deltas are exactly 0, yet the estimate is not; counting ties on both sides doubles them.
    same, other = np.zeros((3, 1)), np.array([[0.0], [0.0], [1.0]])
    d = seed_paired_bootstrap([(same, same), (same, same), (same, other)], mean_of(0), resamples=999)
    assert d.estimate > 0 and d.p_value < 0.8  # ties on both sides: about 0.89
    assert seed_paired_bootstrap([(same, same)] * 3, mean_of(0)).p_value == 1.0


def test_seeds_that_agree_on_a_nonzero_delta_are_not_given_p_one():
    """No spread over seeds leaves no t to compute: the t-test's p is then 0 for a nonzero delta
    (1 only for a zero one), and the bootstrap's p stands, beside an interval that excludes 0."""
    agreed = seed_paired_bootstrap([(np.zeros((3, 1)), np.ones((3, 1)))] * 3, mean_of(0), resamples=999)
    assert agreed.estimate == 1.0 and agreed.low > 0 and agreed.p_value == pytest.approx(2 / 1000), agreed


def test_t_two_sided_p_known_values():
    assert t_two_sided_p(0.0, 2) == pytest.approx(1.0)
    for df, q in ((1, 0.975), (2, 0.975), (7, 0.995), (30, 0.9)):
        assert t_two_sided_p(t_quantile(q, df), df) == pytest.approx(2 * (1 - q), abs=1e-9)


def test_mean_over_seeds_t_interval_covers_at_nominal_rate():
    rng = np.random.default_rng(12)
    truth, reps = 37.0, 2000
    runs = rng.normal(truth, 1.5, size=(reps, 3))
    coverage = np.mean([mean_over_seeds(list(r)).covers(truth) for r in runs])
    assert 0.93 <= coverage <= 0.97  # a normal (z) interval would cover only ~0.81 with 3 seeds


def test_mean_over_seeds_known_values_and_one_seed():
    two = mean_over_seeds([1.0, 3.0])  # sd = sqrt(2), so half-width = t(0.975, 1) * sqrt(2) / sqrt(2)
    assert two.estimate == 2.0
    assert two.low == pytest.approx(2.0 - 12.7062, abs=1e-4) and two.high == pytest.approx(2.0 + 12.7062, abs=1e-4)
    one = mean_over_seeds([0.38])
    assert one.estimate == 0.38 and one.low == -math.inf and one.high == math.inf and one.note
    assert one.format(scale=100) == "38.0 (one seed, no interval)"


# -- exact pieces ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "df, expected",
    [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (10, 2.228), (29, 2.045), (math.inf, 1.960)],
)
def test_t_quantile_known_values(df, expected):
    assert round(t_quantile(0.975, df), 3) == expected
    assert t_quantile(0.025, df) == pytest.approx(-t_quantile(0.975, df))


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_closed_forms(p):
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)  # Cauchy
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    # The series and the Cornish-Fisher branch agree where they meet, and t falls toward z.
    assert 0 < t_quantile(p, 300) - t_quantile(p, 301) < 1e-4
    assert t_quantile(p, 3) > t_quantile(p, 30) > t_quantile(p, math.inf)


def test_t_quantile_rejects_bad_df():
    with pytest.raises(ValueError):
        t_quantile(0.975, 2.5)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)


def test_binomial_tail_matches_enumeration():
    for n in range(13):
        for p in (0.0, 0.1, 0.5, 0.77, 1.0):
            for k in range(-1, n + 2):
                brute = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(max(k, 0), n + 1))
                assert binomial_tail(k, n, p) == pytest.approx(brute, abs=1e-12), (k, n, p)


def test_binomial_tail_far_tail_of_large_n():
    exact = float(Fraction(sum(math.comb(1000, i) for i in range(900, 1001)), 2**1000))
    assert exact < 1e-140
    assert binomial_tail(900, 1000, 0.5) == pytest.approx(exact, rel=1e-9)


def test_wilson_known_values():
    w = wilson_interval(5, 10)
    assert (w.estimate, round(w.low, 4), round(w.high, 4)) == (0.5, 0.2366, 0.7634)
    zero = wilson_interval(0, 10)
    assert zero.low == 0.0 and zero.high == pytest.approx(0.2775, abs=1e-4)
    full = wilson_interval(13, 13)  # where the formula's upper bound rounds to 0.9999999999999999
    assert full.high == 1.0 and full.low == pytest.approx(1 - 0.2281, abs=1e-4)


def test_chance_test_thresholds_and_margin():
    k, n, chance = 35, 100, 0.25
    p = binomial_tail(k, n, chance)
    assert 0.01 < p < 0.05
    assert chance_test(k, n, chance).verdict == "borderline"
    assert chance_test(k, n, chance, clear=p * 1.001).verdict == "above chance"  # p < clear
    assert chance_test(k, n, chance, clear=p, borderline=p * 1.001).verdict == "borderline"  # clear <= p
    assert chance_test(k, n, chance, clear=p / 2, borderline=p).verdict == "not above chance"  # p == borderline
    strong, weak = chance_test(60, 100, 0.25), chance_test(25, 100, 0.25)
    assert strong.verdict == "above chance" and weak.verdict == "not above chance"
    assert strong.margin == pytest.approx(wilson_interval(60, 100).low - 0.25) and strong.margin > 0
    assert weak.margin < 0 and weak.p_value > 0.4


def test_poisson_binomial_equals_binomial_for_equal_chances():
    n, chance = 200, 0.25
    for k in (30, 50, 60, 75):
        correct = np.r_[np.ones(k), np.zeros(n - k)]
        got = chance_test_units(correct, np.full(n, chance))
        assert got.p_value == pytest.approx(binomial_tail(k, n, chance), rel=1e-9)
        assert got.verdict == chance_test(k, n, chance).verdict


def test_poisson_binomial_matches_enumeration_for_mixed_chances():
    chances = np.array([1 / 3, 1 / 4, 1 / 4, 1 / 3, 1 / 2, 1 / 4, 1 / 5, 1 / 3])
    for k in range(len(chances) + 1):
        brute = sum(
            math.prod(c if hit else 1 - c for hit, c in zip(outcome, chances, strict=True))
            for outcome in itertools.product((0, 1), repeat=len(chances))
            if sum(outcome) >= k
        )
        correct = np.r_[np.ones(k), np.zeros(len(chances) - k)]
        assert chance_test_units(correct, chances).p_value == pytest.approx(brute, abs=1e-12)


def test_poisson_binomial_is_sharper_than_binomial_at_the_mean_chance():
    # Half 2-option, half 4-option items: fewer ways to be lucky than Binomial(n, 0.375) allows.
    n = 400
    chances = np.r_[np.full(n // 2, 0.5), np.full(n // 2, 0.25)]
    correct = np.r_[np.ones(170), np.zeros(n - 170)]
    units = chance_test_units(correct, chances)
    assert units.chance == pytest.approx(0.375)
    assert units.p_value < binomial_tail(170, n, 0.375)


# -- results, determinism, general statistics ------------------------------------------------

def test_interval_format_and_covers():
    iv = Interval(0.38, 0.301, 0.459)
    assert iv.format(scale=100) == "38.0 [30.1, 45.9]"
    assert iv.format(digits=2) == "0.38 [0.30, 0.46]"
    assert iv.covers(0.301) and iv.covers(0.4) and not iv.covers(0.46)


def test_delta_verdict_strings():
    def delta(est, low, high):
        return Delta(est, low, high, p_value=0.5, level=0.95, n_units=100, n_seeds=1)

    assert delta(0.02, -0.01, 0.05).verdict == "no detectable difference"
    assert delta(0.02, 0.0, 0.05).verdict == "no detectable difference"  # touching 0 still covers it
    assert delta(0.03, 0.01, 0.05).verdict == "higher"
    assert delta(-0.03, -0.05, -0.01).verdict == "lower"
    assert delta(0.03, 0.01, 0.05).format(scale=100) == "+3.0 [+1.0, +5.0], p=0.500 (100 units, one training seed)"


def test_same_seed_same_result():
    rng = np.random.default_rng(20)
    a, b = _two_arms(rng)
    pairs = [_two_arms(rng) for _ in range(3)]
    assert bootstrap_interval(a, mean_of(0), seed=3) == bootstrap_interval(a, mean_of(0), seed=3)
    assert bootstrap_interval(a, mean_of(0), seed=3) != bootstrap_interval(a, mean_of(0), seed=4)
    assert paired_bootstrap(a, b, mean_of(0), seed=3) == paired_bootstrap(a, b, mean_of(0), seed=3)
    first = seed_paired_bootstrap(pairs, _column_mean, resamples=200, seed=3)
    assert first == seed_paired_bootstrap(pairs, _column_mean, resamples=200, seed=3)


def test_general_path_agrees_with_fast_path():
    # Same draws, so a plain callable computing the mean must give the same interval as mean_of.
    rng = np.random.default_rng(21)
    a = _two_arms(rng, n=120)[0]
    fast, slow = bootstrap_interval(a, mean_of(0), seed=5), bootstrap_interval(a, _column_mean, seed=5)
    np.testing.assert_allclose([fast.low, fast.high], [slow.low, slow.high], rtol=1e-12)
    pairs = [_two_arms(rng, n=80) for _ in range(2)]
    fast_d = seed_paired_bootstrap(pairs, mean_of(0), resamples=300, seed=5)
    slow_d = seed_paired_bootstrap(pairs, _column_mean, resamples=300, seed=5)
    np.testing.assert_allclose([fast_d.low, fast_d.high, fast_d.p_value], [slow_d.low, slow_d.high, slow_d.p_value],
                               rtol=1e-12)


def test_f1_from_column_sums_through_general_path():
    rng = np.random.default_rng(22)
    n = 200
    positive = rng.random(n) < 0.4
    predicted = np.where(positive, rng.random(n) < 0.8, rng.random(n) < 0.2)
    rows = np.stack([positive & predicted, ~positive & predicted, positive & ~predicted], axis=1).astype(float)
    iv = bootstrap_interval(rows, _f1, resamples=500)
    assert iv.estimate == pytest.approx(_f1(rows))
    assert iv.low < iv.estimate < iv.high and 0.02 < iv.high - iv.low < 0.3
    same = paired_bootstrap(rows, rows, _f1, resamples=200)
    assert (same.estimate, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert same.verdict == "no detectable difference"

