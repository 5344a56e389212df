"""The training dataset: a mixture of sources, its rows' lengths, and samples drawn lazily.

Owns turning ``data.mixture`` (LLaVA JSON/JSONL files with image folders, parquet shards in
the hub's layout, hub dataset ids; see ``data.sources``) into one indexable dataset: each
entry's row index (``data.index``, built once and mapped from the ``datasets`` cache) cut to
its ``all`` / ``first:N`` / ``first:P%`` share, the rows that break the rules (``data.rows``)
set aside as skip records, and ``Example``s built only when a sample is drawn, images read
from their file or shard at that moment. A bad sample is either an error naming its file and
row (``on_bad_sample: error``) or skipped and replaced by the next good row (``skip``), so
batches stay full and nothing is silently trained on with zero loss.

Skip records are ``{"file", "row", "cause", "message"}`` (``data.rows.SKIP_CAUSES``): rows
dropped while loading are in ``SupervisedDataset.rejected``, samples dropped when drawn (bad
image, too long) in ``Example.skipped``, which collate passes on as the batch's
``skipped_samples``. ``count_by_cause`` tallies either list for logging. Per-rank memory holds
the lengths and the positions of the good rows, not the rows: those stay memory-mapped.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from torch.utils.data import Dataset

from llava_norm.config import DataSource
from llava_norm.config_schema import LENGTH_ESTIMATES, ConfigError, take_beyond_rows, take_count, take_takes_nothing
from llava_norm.data.collate import Example
from llava_norm.data.conversation import ConversationTokenizer, conversation_tokenizer, fitted_length
from llava_norm.data.images import BadImageError
from llava_norm.data.index import load_index
from llava_norm.data.prompts import PromptEncoder, PromptSettings, with_system
from llava_norm.data.rows import (ROLE_MAP, SKIP_CAUSES, WHOLE_FILE, BadSampleError, check_row,  # noqa: F401 (re-exported)
                                  count_by_cause, read_entries, read_rows_file)
from llava_norm.data.sources import EmbeddedImage, ResolvedSource, resolve

log = logging.getLogger(__name__)
MAX_REPLACEMENTS = 32
IMAGE_PROBES = 64  # rows whose image file is looked for at every start


@dataclass
class Row:
    source: str  # file the row came from
    row_id: str
    messages: list[dict]
    image: Path | EmbeddedImage | None
    length: int  # tokens (or words, see LENGTH_ESTIMATES) + image tokens, for length grouping


def _flags(values) -> np.ndarray:
    """An Arrow boolean column as a numpy bool array."""
    return values.to_numpy(zero_copy_only=False).astype(bool) if len(values) else np.zeros(0, bool)


def _probe_image_folder(index, source: ResolvedSource, with_image: np.ndarray, key: str, on_bad_sample: str) -> None:
    """The 558K check of the image folder, at every start and cheaply: are the images of
    IMAGE_PROBES rows, spread over the source, where the rows say? None found is a wrong
    ``image_folder`` (an unzip that added a level of folders, say): an error now rather than
    every row skipped when drawn. Some missing is a warning: those rows are skipped when drawn (under
    ``on_bad_sample: error`` the first one drawn stops the run)."""
    if source.kind != "llava_json" or not len(with_image):
        return
    picks = with_image[np.linspace(0, len(with_image) - 1, min(IMAGE_PROBES, len(with_image))).astype(np.int64)]
    folder = Path(source.image_folder or source.files[0].parent)
    names = index.select(picks)["image"]
    missing = [name for name in names if not (folder / name).is_file()]
    if len(missing) == len(names):
        raise ConfigError(f"key '{key}.image_folder': none of {len(names)} images sampled from {source.files[0]} is "
                          f"under {folder} (e.g. {folder / missing[0]}); point image_folder at the folder that "
                          "holds the rows' image paths")
    if missing:
        then = ("the first row drawn without its image stops the run (data.on_bad_sample: error)"
                if on_bad_sample == "error" else "rows without their image are skipped when drawn")
        log.warning("%s: %d of %d images sampled from %s are missing under %s (e.g. %s); %s", key, len(missing),
                    len(names), source.files[0], folder, missing[0], then)


class Rows:
    """The good rows as a read-only sequence of ``Row``s, each built from the index on access."""

    def __init__(self, dataset: SupervisedDataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset.where)

    def __getitem__(self, i: int) -> Row:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self.dataset.row(int(i) % len(self))

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class SupervisedDataset(Dataset):
    def __init__(self, mixture: list[DataSource], encoder: ConversationTokenizer, image_processor,
                 max_length: int, image_aspect: str = "resize", on_bad_sample: str = "skip",
                 length_estimate: str = "tokens", system_prompt: str | None = None, image_placement: str = "front",
                 exact_lengths: bool = False):
        """``system_prompt``: a system turn for every row that has none of its own, the same
        one evaluation puts in its prompts (``data.system_prompt``); None keeps the template's.
        Samples are built by ``data.prompts.PromptEncoder``, the path evaluation and the
        diagnostics build their prompts with. Under several processes, build it in the main
        process first (``TrainingArguments.main_process_first``): the others then map the
        indexes it wrote. ``exact_lengths``: the indexes also keep each row's exact encoded length
        at every turn end (packing's plan reads them instead of tokenising at each start)."""
        if length_estimate not in LENGTH_ESTIMATES:
            raise ValueError(f"data.length_estimate must be one of {LENGTH_ESTIMATES}, got {length_estimate!r}")
        self.encoder = encoder
        self.prompts = PromptEncoder(encoder, image_processor, system_prompt, image_aspect)
        self.image_processor = image_processor
        self.max_length = max_length
        self.image_aspect = image_aspect
        self.on_bad_sample = on_bad_sample
        self.length_estimate = length_estimate
        self.system_prompt = system_prompt
        self.sources: list[ResolvedSource] = []
        self.indexes = []  # one memory-mapped datasets.Dataset per source (data.index)
        self.rejected: list[dict] = []  # skip records (see BadSampleError.record) of rows dropped at load time
        self.adjusted: dict[str, int] = {}  # rows the row rules changed as LLaVA does (rows.ADJUSTMENTS), by kind
        where_source, where_row, lengths, has_image = [], [], [], []
        for i, source in enumerate(mixture):
            resolved = resolve(source, f"data.mixture[{i}]")
            index = load_index(resolved, encoder, system_prompt, count_tokens=length_estimate == "tokens",
                               image_placement=image_placement, exact_lengths=exact_lengths)
            table = index.data  # Arrow columns, memory-mapped: no row or string becomes a Python object here
            whole = _flags(pc.equal(table.column("position"), WHOLE_FILE))
            position_rows = np.flatnonzero(~whole)
            rows = position_rows[:take_count(len(position_rows), source.take, f"data.mixture[{i}].take")]
            if len(position_rows) and not len(rows):
                raise ConfigError(take_takes_nothing(source.take, len(position_rows), f"data.mixture[{i}].take"))
            beyond = take_beyond_rows(source.take, len(position_rows), f"data.mixture[{i}].take")
            if beyond:
                log.warning(beyond)
            taken = np.sort(np.concatenate([np.flatnonzero(whole), rows]))
            bad = taken[~_flags(pc.equal(table.column("cause"), ""))[taken]]
            for entry in index.select(bad).select_columns(["file", "row_id", "cause", "message"]):
                self.reject(BadSampleError(entry["message"], file=str(resolved.files[entry["file"]]),
                                           row=entry["row_id"], cause=entry["cause"]))
            if resolved.expected_rows is not None and len(position_rows) != resolved.expected_rows:
                self.reject(BadSampleError(  # bad input like any other: an error, or a warning and a record
                    f"data.mixture[{i}]: the dataset card says {resolved.expected_rows} rows, its {len(resolved.files)} "
                    f"shards in {resolved.files[0].parent} hold {len(position_rows)}: a partial download? Run the "
                    "download again (data/README.md)", file=str(resolved.files[0].parent), row=WHOLE_FILE,
                    cause="rows_missing"))
            good = np.setdiff1d(taken, bad, assume_unique=True)
            for kinds, n in Counter(table.column("adjusted").take(pa.array(good)).to_pylist()).items():
                for kind in filter(None, kinds.split(",")):
                    self.adjusted[kind] = self.adjusted.get(kind, 0) + n
            counts = table.column("tokens" if length_estimate == "tokens" else "words").to_numpy()
            images = ~_flags(pc.equal(table.column("image"), ""))
            _probe_image_folder(index, resolved, good[images[good]], f"data.mixture[{i}]", self.on_bad_sample)
            where_source.append(np.full(len(good), i, dtype=np.int32))
            where_row.append(good.astype(np.int64))
            lengths.append(counts[good].astype(np.int64))
            has_image.append(images[good])
            self.sources.append(resolved)
            self.indexes.append(index)
        self.where_source = np.concatenate(where_source) if where_source else np.zeros(0, np.int32)
        self.where = np.concatenate(where_row) if where_row else np.zeros(0, np.int64)
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        self.has_image = np.concatenate(has_image) if has_image else np.zeros(0, bool)
        self.rows = Rows(self)
        for kind, n in self.adjusted.items():
            log.info("%d rows: %s, as LLaVA's training code does (data/README.md)", n, kind.replace("_", " "))
        if self.rejected:
            log.warning("skipped %d bad rows at load time %s; first: %s", len(self.rejected),
                        count_by_cause(self.rejected), self.rejected[0]["message"])
        if not len(self.where):
            first = f"; first rejection: {self.rejected[0]['message']}" if self.rejected else ""
            raise BadSampleError(f"no usable rows in {[s.path or s.hub for s in mixture]}{first}",
                                 cause="no_usable_rows")

    @classmethod
    def from_settings(cls, mixture: list[DataSource], bundle, settings: PromptSettings, max_length: int,
                      **options) -> SupervisedDataset:
        """The dataset a run with these prompt settings trains on (``options``: on_bad_sample, length_estimate)."""
        return cls(mixture, conversation_tokenizer(bundle, settings.prompt_format, settings.template_kwargs),
                   bundle.image_processor, max_length, settings.image_aspect, system_prompt=settings.system_prompt,
                   **options)

    def exact_lengths(self, max_length: int) -> list[int] | None:
        """Each good row's exact length once truncated at ``max_length`` (``fitted_length``), from
        the indexes; None when they were built without exact lengths."""
        out = []
        for s, index in enumerate(self.indexes):
            rows = self.where[self.where_source == s]
            table = index.data
            if "exact_tokens" not in table.column_names:
                return None
            totals = table.column("exact_tokens").to_numpy()[rows]
            if (totals < 0).any():
                return None
            lengths = totals.astype(np.int64)
            over = np.flatnonzero(totals > max_length)  # only these need their turn ends
            if len(over):
                ends = table.column("turn_ends").take(pa.array(rows[over])).to_pylist()
                lengths[over] = [fitted_length(int(t), e, max_length) for t, e in zip(totals[over], ends)]
            out.append(lengths)
        return np.concatenate(out).tolist() if out else []

    def reject(self, error: BadSampleError) -> None:
        if self.on_bad_sample == "error":
            raise error
        self.rejected.append(error.record())

    def __len__(self) -> int:
        return len(self.where)

    def row(self, i: int) -> Row:
        """Good row ``i``, read from its source's index."""
        s = int(self.where_source[i])
        source, entry = self.sources[s], self.indexes[s][int(self.where[i])]
        file = source.files[entry["file"]]
        image = None
        if entry["image"] and source.kind == "parquet":
            image = EmbeddedImage(str(file), entry["group"], entry["group_row"],
                                  f"{file}: row {entry['row_id']} ({entry['position']}), embedded image")
        elif entry["image"]:
            image = Path(source.image_folder or file.parent) / entry["image"]
        # the system turn is part of the row: packing's exact lengths count it too
        return Row(str(file), entry["row_id"], with_system(json.loads(entry["messages"]), self.system_prompt), image,
                   int(self.lengths[i]))

    @cached_property
    def modality_lengths(self) -> np.ndarray:
        """Positive for samples with an image, negative for text-only (the grouped sampler's
        convention); token counts are cut at max_length, as the samples are."""
        lengths = np.minimum(self.lengths, self.max_length) if self.length_estimate == "tokens" else self.lengths
        return np.where(self.has_image, lengths, -lengths)

    def build(self, row: Row) -> Example:
        where = dict(file=row.source, row=row.row_id)
        try:
            example = self.prompts.example(row.messages, [row.image] if row.image is not None else [],
                                           max_length=self.max_length, sample_id=row.row_id)
        except BadImageError as error:
            raise BadSampleError(f"{row.source}: row {row.row_id}: {error}", cause=error.cause, **where) from None
        if example is None:
            raise self.too_long(row)
        return example

    def too_long(self, row: Row, limit: str = "") -> BadSampleError:
        """The refusal of a row whose first turn does not fit (``limit``: the words for the bound)."""
        limit = limit or f"max_length={self.max_length}"
        return BadSampleError(f"{row.source}: row {row.row_id}: first turn does not fit {limit}", cause="too_long",
                              file=row.source, row=row.row_id)

    def draw(self, row: Row, skipped: list[dict]) -> Example | None:
        """``build(row)``, or under ``on_bad_sample: skip`` None with the skip record appended to ``skipped``."""
        try:
            return self.build(row)
        except BadSampleError as error:
            if self.on_bad_sample == "error":
                raise
            # the trainer logs the first few of each process (LlavaNormTrainer._say_skips): each loader
            # worker holds its own copy of this dataset, so a count here would be per worker and epoch
            log.debug("skipping bad sample: %s", error)
            skipped.append(error.record())
            return None

    def __getitem__(self, index: int) -> Example:
        # A bad row is replaced by the next one in file order: the same index always gives the
        # same sample and the same skip records, so a resumed run skips exactly what the first did.
        skipped: list[dict] = []
        for attempt in range(MAX_REPLACEMENTS):
            example = self.draw(self.rows[(index + attempt) % len(self)], skipped)
            if example is not None:
                example.skipped = skipped
                return example
        raise BadSampleError(f"{MAX_REPLACEMENTS} consecutive bad samples from index {index}; "
                             f"last: {skipped[-1]['message']}", cause="too_many_bad_samples")
