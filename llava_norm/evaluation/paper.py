"""The paper's published Table 4 numbers, and which of our runs each one belongs beside.

Owns this repository's one copy of the numbers in "The Unseen Bias" (arXiv 2512.08374),
Table 4, first half, as the project's notes on the paper (METHOD.md, not shipped with the code)
transcribe it and the paper's text confirms: for two backbones (Llama-3.2-3B-Instruct and Qwen2.5-7B-Instruct, each with
SigLIP-SO400M-Patch14-384; the paper's section 5.2), the baseline ("w/o Norm", our arm
``none``) and "w/ Norm (w/ GWC)" (our arm ``ln_textnorm_gwc``), in the four columns whose
header names a benchmark. It also owns how a run is matched to a row (``paper_row``) and what
each column's number means next to ours (``CAVEATS``).

Left out on purpose:

- the first column of each half: its header cell was lost in extraction. It is probably
  MMBench, but a number whose benchmark is a guess is not attributed to any benchmark;
- the second half's five columns: no header names them (ScienceQA, AI2D, HellaSwag, MMLU and
  probably an average, order unknown);
- the "w/ Norm (w/o GWC)" rows, which METHOD.md's table does not carry.

All numbers are percentages as printed. Scales: every column is already on ours (0-100);
OCRBench's 40.70 is its final score out of 1,000 divided by 10, i.e. the share of the 1,000
items answered right in percent, which is our OCRBench headline (``accuracy`` x 100). So no
number is converted; ``CAVEATS`` says so where it could be doubted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llava_norm.config_schema import is_hub_id

SOURCE = '"The Unseen Bias" (arXiv 2512.08374), Table 4'
SIGLIP = "google/siglip-so400m-patch14-384"


@dataclass(frozen=True)
class Backbone:
    label: str  # the paper's name for the row
    llm: str  # hub id
    vision_tower: str  # hub id


BACKBONES = (
    Backbone("Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct", SIGLIP),
    Backbone("Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct", SIGLIP),
)
# Our arm (``model.norm_alignment``) -> the paper's "Method" cell.
METHODS = {"none": "w/o Norm", "ln_textnorm_gwc": "w/ Norm (w/ GWC)"}
# Our benchmark (registry name) -> the paper's column header, for the named columns only.
COLUMNS = {"mmstar": "MM-Star", "pope": "POPE", "seedbench2_plus": "SEED-Bench-2", "ocrbench": "OCRBench"}

# (backbone label, our arm) -> {our benchmark: the paper's number}. Table 4, first half.
TABLE_4: dict[tuple[str, str], dict[str, float]] = {
    ("Llama-3.2-3B", "none"): {"mmstar": 37.72, "pope": 88.14, "seedbench2_plus": 42.86, "ocrbench": 40.70},
    ("Llama-3.2-3B", "ln_textnorm_gwc"): {"mmstar": 41.24, "pope": 88.26, "seedbench2_plus": 45.56,
                                          "ocrbench": 44.10},
    ("Qwen2.5-7B", "none"): {"mmstar": 50.34, "pope": 87.51, "seedbench2_plus": 56.65, "ocrbench": 47.00},
    ("Qwen2.5-7B", "ln_textnorm_gwc"): {"mmstar": 50.58, "pope": 87.87, "seedbench2_plus": 58.27,
                                        "ocrbench": 49.40},
}

# What a reader must know before reading our number against the paper's, per column.
CAVEATS = {
    "mmstar": "the paper does not say whether MM-Star is the macro mean over the L2 categories "
              "(lmms-eval, our headline) or the micro mean over items (VLMEvalKit); none of its four values is a "
              "count out of MMStar's 1,500 items, so they are not the micro mean",
    "pope": "the paper does not say which POPE metric it reports; ours is F1 ('yes' positive), "
            "the mean over the adversarial, popular and random splits",
    "seedbench2_plus": "the paper's header reads SEED-Bench-2, its appendix lists SEED-Bench-2-Plus; values of "
                       "43-59 fit SEED-Bench-2-Plus, which is what we evaluate, but 45.56 is no count out of its 2,277 "
                       "items, rounded or cut to two decimals (58.27 is one only cut: 1,327), so not the accuracy over "
                       "all items, our headline",
    "ocrbench": "the paper's number is the final score out of 1,000 divided by 10; ours is the share of items "
                "right in percent: the same number on the full 1,000 items, so nothing is converted",
}
# Named under every comparison, so a missing MMBench column reads as a decision, not an oversight.
NOT_ATTRIBUTED = ("the paper's first column (probably MMBench, but its header was lost in extraction) and the "
                  "second half's five unnamed columns: no header names their benchmark")


@dataclass(frozen=True)
class PaperRow:
    backbone: Backbone
    arm: str  # ours
    values: dict[str, float]  # our benchmark -> the paper's number

    @property
    def label(self) -> str:
        """How the row is named wherever it is printed: always as the paper's."""
        return f"paper: {self.backbone.label} {METHODS[self.arm]}"


def same_backbone(value: str, hub_id: str) -> bool:
    """Whether a config's backbone (a hub id or a local folder) is the hub model ``hub_id``.

    A hub id must be that id (another organisation's upload of the same name may be a
    fine-tune); a local folder matches when its name is the hub id's last part (e.g.
    ``/models/Llama-3.2-3B-Instruct``). A folder named otherwise matches nothing: a run is
    never put beside the paper on a guess."""
    if value == hub_id:
        return True
    return not is_hub_id(value) and Path(value.rstrip("/")).name == hub_id.split("/")[-1]


def paper_row(llm: str, vision_tower: str, arm: str) -> PaperRow | None:
    """The paper's row for a run of backbone ``llm`` + ``vision_tower`` and arm ``arm``
    (``model.norm_alignment``); None when the paper reports no such run."""
    for backbone in BACKBONES:
        if (backbone.label, arm) in TABLE_4 and same_backbone(llm, backbone.llm) and same_backbone(
                vision_tower, backbone.vision_tower):
            return PaperRow(backbone, arm, TABLE_4[(backbone.label, arm)])
    return None


def describe() -> str:
    """One line naming what the paper reports, for ``--help``."""
    backbones = ", ".join(b.label for b in BACKBONES)
    return f"{SOURCE}: {backbones} with SigLIP-SO400M, arms {' and '.join(METHODS)}, on {', '.join(COLUMNS)}"
