"""What the demo's numbers say, as verdicts with margins that hold on any machine.

Owns the demo's claims: the paper's mechanism (norms at the interface, update rates through
the LLM, the GWC gradient ratio, gain growth), each a measured number against a stated
threshold, and the benchmark statistics (each score with a 95% interval, a test against
guessing, each arm delta with a paired-bootstrap interval over items). The thresholds sit far
from where the last bits of a float kernel could move a number; the margin says how far.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llava_norm.evaluation.units import Units
from llava_norm.stats import ChanceVerdict, Delta, Interval, bootstrap_interval, chance_test_units, paired_bootstrap

RESAMPLES = 2000  # for every interval and delta
UNTESTED = "not tested against guessing (free-form answers)"


@dataclass(frozen=True)
class Claim:
    """One statement of the paper, checked on this run."""

    text: str  # what the paper says, in the demo's terms
    where: str  # the paper's table or figure
    measured: str  # the number(s)
    threshold: str  # what the number must clear for the claim to hold
    held: bool
    margin: str  # how far from the threshold
    by_construction: bool = False  # holds by how the arm is built: it checks the code, not training


def load_json(path: Path) -> dict | None:
    """A JSON file the demo wrote, or None where it does not exist (yet)."""
    return json.loads(path.read_text()) if path.is_file() else None


def _times(factor: float) -> str:
    return f"{factor:.2g}×" if factor < 10 else f"{factor:,.0f}×"


def _claim(text: str, where: str, value: float, threshold: float, unit: str, measured: str,
           above: bool = True, digits: int = 2, by_construction: bool = False) -> Claim:
    held = value > threshold if above else value < threshold
    if above and unit.startswith("×"):  # a ratio against a ratio: say how many times over
        margin = f"{_times(value / threshold)} the threshold"
    elif above:
        margin = f"{abs(value - threshold):.{digits}g}{unit} {'above' if held else 'below'} it"
    else:  # a small error: how many times under the bound says more than a difference
        margin = f"{_times(threshold / value)} under it" if held and value > 0 else \
            "exactly 0" if held else f"{_times(value / threshold)} over it"
    return Claim(text, where, measured, f"{'>' if above else '<'} {threshold:g}{unit}", held, margin, by_construction)


def mechanism_claims(diag: Path, baseline: str, aligned: str, init_label: str) -> list[Claim]:
    """The mechanism, from the diagnostics' JSON files (missing files give no claim)."""
    claims = []
    interface = load_json(diag / "interface_norms.json")
    if interface:
        rows = {r["label"]: r for r in interface["rows"]}
        init, base, gwc = rows.get(init_label), rows.get(f"{baseline} stage 1"), rows.get(f"{aligned} stage 1")
        base_ratio = base["projector_output"]["mean"] / base["text_norm_T"] if base else None
        if base:
            claims.append(_claim("Without alignment, visual tokens enter the LLM far above the text norm T",
                                 "Tables 1-2", base_ratio, 2, "× T", f"{base_ratio:.1f}× T after stage 1"))
        if init:
            error = abs(init["norm_output"]["mean"] / init["text_norm_T"] - 1)
            claims.append(_claim("The text-norm init puts visual tokens at norm T", "Sec. 4 (init)", error, 0.01,
                                 "", f"|norm / T - 1| = {error:.1e} at initialisation", above=False,
                                 by_construction=True))
        if base and gwc:
            gwc_ratio = gwc["norm_output"]["mean"] / gwc["text_norm_T"]
            factor = base_ratio / gwc_ratio
            claims.append(_claim("The norm layer keeps visual tokens within a small factor of T, far closer "
                                 "than without it",
                                 "Tables 1-2", factor, 2, "×",
                                 f"{gwc_ratio:.2f}× T with it, {base_ratio:.1f}× T without (after stage 1)"))
    layers = load_json(diag / "layers.json")
    if layers:
        cos = {c["label"]: {g: sum(c[g]["cosine"]) / len(c[g]["cosine"]) for g in ("image", "text") if c[g]["cosine"]}
               for c in layers["curves"]}
        if baseline in cos and {"image", "text"} <= set(cos[baseline]):
            gap = cos[baseline]["image"] - cos[baseline]["text"]
            claims.append(_claim("Without alignment, image tokens are updated less than text through the LLM",
                                 "Fig. 4", gap, 0.05, "", f"layer-to-layer cosine {cos[baseline]['image']:.2f} "
                                 f"(image) vs {cos[baseline]['text']:.2f} (text)"))
        if baseline in cos and aligned in cos:
            gap = cos[baseline]["image"] - cos[aligned]["image"]
            claims.append(_claim("With the norm layer, image tokens are updated more", "Fig. 4", gap, 0.05, "",
                                 f"image cosine {cos[aligned]['image']:.2f} with it, {cos[baseline]['image']:.2f} "
                                 "without (final models)"))
    flow = load_json(diag / "gradient_flow.json")
    check = (flow or {}).get("gwc_check") or {}
    observed = check.get("observed_ratio", {}).get("projector_linears")
    predicted = check.get("predicted_ratio_mean_abs_g")
    if observed is not None and predicted:
        error = abs(observed / predicted - 1)
        claims.append(_claim("Without GWC the projector's gradient shrinks by mean|g| (what GWC compensates)",
                             "Eq. (GWC)", error, 1e-3, "", f"ratio {observed:.4g}, mean|g| {predicted:.4g} "
                             f"(relative error {error:.1e})", above=False, by_construction=True))
    gains = load_json(diag / "gain_stats.json")
    first = next((r for r in (gains or {}).get("rows", []) if r.get("gain_abs_mean") is not None), None)
    if first:
        growth = first["gain_abs_mean"] / first["text_norm_init_abs_mean"] - 1
        claims.append(_claim("The norm layer's gain grows from its init T/√d during training", "Table 5",
                             100 * growth, 1, "%", f"mean|g| {first['text_norm_init_abs_mean']:.4g} → "
                             f"{first['gain_abs_mean']:.4g} ({first['label']})"))
    return claims


@dataclass(frozen=True)
class Score:
    """One arm on one benchmark."""

    interval: Interval  # headline in percent, 95% bootstrap interval over units
    chance: ChanceVerdict  # exact test of the units right against guessing
    above: str  # "above chance" | "borderline" | "not above chance" | UNTESTED

    @property
    def chance_level(self) -> float:
        """Percent of units guessing gets right."""
        return 100 * self.chance.chance

    @property
    def margin(self) -> float:
        """Points: the Wilson 95% low end of the share right minus chance."""
        return 100 * self.chance.margin

    def describe(self) -> str:
        if self.above == UNTESTED:
            return f"{self.chance.k}/{self.chance.n} right; {UNTESTED}"
        p = "p < 1e-4" if self.chance.p_value < 1e-4 else f"p = {self.chance.p_value:.2g}"
        return f"{self.above}: {self.chance.k}/{self.chance.n} right ({p}; margin {self.margin:+.1f} points)"


def score(units: Units, seed: int = 0) -> Score:
    interval = bootstrap_interval(units.rows, units.statistic, resamples=RESAMPLES, seed=seed)
    test = chance_test_units(units.correct, units.chances)
    # Free-form answers have no uniform guess to beat (a fixed reply can still match items whose
    # answer it names), so no verdict is claimed against guessing.
    verdict = UNTESTED if not units.chances.any() else test.verdict
    return Score(interval, test, verdict)


def delta(base: Units, other: Units, seed: int = 0) -> Delta:
    """``other - base`` on the same units, paired by unit (one training seed each)."""
    if base.ids != other.ids:
        raise ValueError(f"{base.benchmark}: the two runs scored different items; no paired delta")
    return paired_bootstrap(base.rows, other.rows, base.statistic, resamples=RESAMPLES, seed=seed)
