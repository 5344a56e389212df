"""What DeepSpeed itself makes of a run's DeepSpeed JSON, asked before a launch (``llava-norm check``).

Owns ``deepspeed_json_problems``. DeepSpeed reads the top-level keys it knows and ignores every
other, so a misspelt section ("zero_optimisation") trains without it, silently; and the checks of
its sections (a key unknown under ``zero_optimization``, a value of the wrong type) fail only
inside ``deepspeed.initialize``, after the model has loaded. Both are found here by handing a copy
of the file to DeepSpeed's own config class, the values transformers fills in for "auto" set, and
recording which keys it reads: what it never asks for, it never uses.
"""

from __future__ import annotations

import difflib
import logging

# Read outside DeepSpeed's config class: by deepspeed.initialize itself (the data x sequence
# parallel mesh), and by accelerate (its MS-AMP section).
READ_ELSEWHERE = frozenset({"data_parallel_size", "sequence_parallel_size", "msamp"})


class _ReadKeys(dict):
    """A dict that records the keys asked for. Where a reader walks every key it records them
    all, so a key is reported as unread only when no reader could have seen it."""

    def __init__(self, settings: dict):
        super().__init__(settings)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def keys(self):
        return _Keys(self)

    def __copy__(self):  # DeepSpeedConfig reads a copy: the copy reports to the same record
        twin = _ReadKeys(dict(dict.items(self)))
        twin.read = self.read
        return twin

    def __iter__(self):
        self.read.update(dict.keys(self))
        return super().__iter__()

    def items(self):
        self.read.update(dict.keys(self))
        return super().items()

    def values(self):
        self.read.update(dict.keys(self))
        return super().values()


class _Keys:
    """``settings.keys()`` as DeepSpeed uses it: ``KEY in settings.keys()`` asks for one key."""

    def __init__(self, owner: _ReadKeys):
        self.owner = owner

    def __contains__(self, key):
        self.owner.read.add(key)
        return dict.__contains__(self.owner, key)

    def __iter__(self):
        self.owner.read.update(dict.keys(self.owner))
        return iter(dict.keys(self.owner))

    def __len__(self):
        return dict.__len__(self.owner)


def _without_auto(node):
    """``node`` with every "auto" value left out: DeepSpeed's default stands in for what
    transformers would fill in, which the launch check compares separately."""
    if isinstance(node, dict):
        return {key: _without_auto(value) for key, value in node.items() if value != "auto"}
    return node


def deepspeed_json_problems(settings: dict, path: str, micro_batch: int, grad_accum: int) -> list[str]:
    """One line per problem DeepSpeed would have with ``settings`` (the JSON object at ``path``):
    a top-level key it never reads, or its own refusal of a section. The batch sizes are this
    run's (``micro_batch`` per process, ``grad_accum`` steps), set as transformers sets them."""
    copy = _without_auto(settings)
    copy.pop("train_batch_size", None)  # DeepSpeed derives it from these two and the world size
    copy.update(train_micro_batch_size_per_gpu=micro_batch, gradient_accumulation_steps=grad_accum)
    seen = _ReadKeys(copy)
    # Its log lines (the accelerator it found at import, the mesh and world size of this copy) are
    # not the check's to print; the logger is DeepSpeed's own, named before it is first imported.
    deepspeed_log, drop = logging.getLogger("DeepSpeed"), (lambda record: False)
    deepspeed_log.addFilter(drop)
    version = "(not importable)"
    try:
        import deepspeed
        from deepspeed.runtime.config import DeepSpeedConfig

        version = deepspeed.__version__
        DeepSpeedConfig(seen)
    except Exception as error:  # noqa: BLE001 - DeepSpeed's refusal, however it raises it, said in one line
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        said = "; ".join(line for line in lines[:4] if not line.startswith("For further information"))
        return [f"key 'train.deepspeed': {path}: DeepSpeed {version} refuses it: {said}"]
    finally:
        deepspeed_log.removeFilter(drop)
    problems = []
    for key in sorted(set(settings) - seen.read - READ_ELSEWHERE):
        near = difflib.get_close_matches(key, sorted(seen.read), n=1)
        problems.append(f"key 'train.deepspeed': {path} sets '{key}', which DeepSpeed {version} never "
                        f"reads{f' (did you mean {near[0]!r}?)' if near else ''}; remove it or correct its name")
    return problems
