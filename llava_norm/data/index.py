"""The row index of one mixture entry: every row checked once, kept in the ``datasets`` cache.

Owns building, for one resolved source, an Arrow table with one entry per position in its
files, in file order: the row's file, position, id, messages and image reference with its
word and token counts, or the cause and message that rejected it. It is written by
``datasets.Dataset.from_generator`` under a fingerprint of everything the entries depend on
(each file's fingerprint from ``llava_norm.provenance``, the source of the modules that check
and count rows, the tokenizer and the prompt settings that count tokens), so a later start,
on any rank, maps the finished table from disk instead of reading the corpus again; anything
different builds a new one. Images are not in the table: they stay in their folder or shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from llava_norm.data.conversation import ConversationTokenizer
from llava_norm.data.prompts import with_system
from llava_norm.data.rows import WHOLE_FILE, BadSampleError, check_row, no_rows, read_entries
from llava_norm.data.sources import ResolvedSource, parquet_rows
from llava_norm.provenance import FingerprintMemo

log = logging.getLogger(__name__)
# The code that decides an index's entries: a change to any of them builds new indexes.
RULE_MODULES = ("rows.py", "sources.py", "index.py", "conversation.py", "prompts.py")
COUNT_CHUNK = 4096  # rows tokenised per batched tokenizer call
# A cold build reads and counts shards in parallel, up to MAX_PROCESSES processes, once the
# source is big enough to pay for starting them.
MAX_PROCESSES = 32
PARALLEL_BYTES = 64 << 20
NO_GROUP = -1  # group / group_row of a row whose image is a file, not embedded


def features():
    from datasets import Features, Sequence, Value

    return Features({
        "file": Value("int32"),  # index into the source's files
        "position": Value("string"),  # "line N" (JSONL), "row N" (parquet), "" (JSON list), "*" (whole file)
        "row_id": Value("string"),
        "messages": Value("string"),  # JSON of [{role, content}]: one string encodes fast, a nested list does not
        "image": Value("string"),  # relative path (JSON), sources.EMBEDDED (parquet), "" (text-only)
        "group": Value("int32"),
        "group_row": Value("int32"),
        "words": Value("int32"),  # words + the image's tokens: the cheap length estimate
        "tokens": Value("int32"),  # encoded length, image tokens included (-1 when not counted)
        # packing's exact lengths (ConversationTokenizer.encoded_turn_ends): the length before
        # truncation and at each assistant turn's end (-1 and [] when not taken)
        "exact_tokens": Value("int32"),
        "turn_ends": Sequence(Value("int32")),
        "cause": Value("string"),  # "" for a good row, else a rows.SKIP_CAUSES entry
        "adjusted": Value("string"),  # what the row rules changed in a good row: rows.ADJUSTMENTS, comma-joined
        "message": Value("string"),
    })


def counting_key(encoder: ConversationTokenizer, system_prompt: str | None, count_tokens: bool,
                 exact_lengths: bool = False) -> dict:
    """What the counts depend on: the tokenizer (its full serialisation), its templates and
    the prompt settings; the words-only estimate depends on the image size alone. Which rows the
    prompt format can encode depends on the format."""
    # the format always: which rows it can encode is decided in the index (row_problem)
    key = {"tokens_per_image": encoder.tokens_per_image, "count_tokens": count_tokens, "exact_lengths": exact_lengths,
           "format": type(encoder.format).__name__}
    if count_tokens or exact_lengths:
        tokenizer, form = encoder.tokenizer, encoder.format
        backend = getattr(tokenizer, "backend_tokenizer", None)
        serialised = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
        key.update(tokenizer=hashlib.sha256(serialised.encode()).hexdigest(),
                   chat_template=getattr(tokenizer, "chat_template", None), bos=tokenizer.bos_token,
                   eos=tokenizer.eos_token, end_of_turn=getattr(form, "end_of_turn", None),
                   template_kwargs=getattr(form, "template_kwargs", None), system_prompt=system_prompt,
                   image_token_id=encoder.image_token_id)
    return key


def index_fingerprint(source: ResolvedSource, counting: dict, image_placement: str = "front",
                      memo: FingerprintMemo | None = None) -> str:
    """The key of the source's index. ``memo``: shard fingerprints kept between starts, so a warm
    start stats each shard and reads none of it (without one, each shard is fingerprinted)."""
    memo = memo or FingerprintMemo(_memo_folder())
    code = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in RULE_MODULES:
        code.update((here / name).read_bytes())
    # the content fingerprint samples a big file; its size and modification time catch an edit in between
    stats = [f.stat() for f in source.files]
    spec = {"kind": source.kind,
            "files": [[str(f), memo.fingerprint(f), s.st_size, s.st_mtime_ns] for f, s in zip(source.files, stats)],
            "image_folder": source.image_folder, "code": code.hexdigest(), "counting": counting,
            "image_placement": image_placement}
    memo.save()
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _memo_folder() -> Path:
    """Beside the indexes: the datasets cache (HF_DATASETS_CACHE), shared by the node's ranks."""
    from datasets import config

    return Path(config.HF_DATASETS_CACHE)


def _entries(source: ResolvedSource, files: list[int]):
    """(file index, position, raw row or BadSampleError, group, group row), in file order."""
    for f in files:
        path = source.files[f]
        try:
            if source.kind == "llava_json":
                for index, (line, raw) in enumerate(read_entries(path)):
                    yield f, (f"line {line}" if line is not None else ""), raw, NO_GROUP, NO_GROUP
            else:
                found = False
                for position, raw, group, group_row in parquet_rows(path):
                    found = True
                    yield f, position, raw, group, group_row
                if not found:
                    raise no_rows(path)
        except BadSampleError as error:  # the whole file
            yield f, WHOLE_FILE, error, NO_GROUP, NO_GROUP


def _generate(files: list[int], source: ResolvedSource, encoder: ConversationTokenizer, system_prompt: str | None,
              count_tokens: bool, image_placement: str = "front", exact_lengths: bool = False):
    """The entries of ``files`` (indexes into ``source.files``); datasets splits the list into
    contiguous runs, one per process, and keeps their order."""
    first = source.files[0] if len(source.files) == 1 else f"{len(source.files)} files in {source.files[0].parent}"
    if files and files[0] == 0:  # the process that reads the first file speaks for all of them
        print(f"[llava-norm] data index (rank {os.environ.get('RANK', '0')}): checking every row of {first} once"
          f"{' and counting its tokens' if count_tokens else ''}; later starts map it from the datasets cache",
              flush=True)
    pending: list[dict] = []

    def flush():
        good = [e for e in pending if not e["cause"]]
        conversations = [with_system(e["messages"], system_prompt) for e in good] if count_tokens or exact_lengths \
            else []
        if count_tokens and good:
            for entry, count in zip(good, encoder.count_tokens(conversations)):
                entry["tokens"] = count
        if exact_lengths and good:
            exact = encoder.encoded_turn_ends(conversations)
            for entry, (total, ends) in zip(good, exact):
                entry["exact_tokens"], entry["turn_ends"] = total, ends
        for entry in pending:
            entry["messages"] = json.dumps(entry["messages"], ensure_ascii=False)
        yield from pending
        pending.clear()

    index_in_file, current = 0, -1
    for f, position, raw, group, group_row in _entries(source, files):
        if f != current:
            current, index_in_file = f, 0
        entry = {"file": f, "position": position, "row_id": "", "messages": [], "image": "", "group": group,
                 "group_row": group_row, "words": 0, "tokens": -1, "exact_tokens": -1, "turn_ends": [], "cause": "",
                 "message": "", "adjusted": ""}
        try:
            if isinstance(raw, BadSampleError):
                raise raw
            row = check_row(raw, str(source.files[f]), index_in_file, position or None, image_placement,
                            encoder.format.row_problem)
            entry.update(row_id=row.row_id, messages=row.messages, image=row.image or "",
                         words=row.words + (encoder.tokens_per_image if row.image else 0),
                         adjusted=",".join(row.adjustments))
        except BadSampleError as error:
            entry.update(row_id=error.row, cause=error.cause, message=str(error))
        if position != WHOLE_FILE:
            index_in_file += 1
        pending.append(entry)
        if len(pending) >= COUNT_CHUNK:
            yield from flush()
    yield from flush()


def load_index(source: ResolvedSource, encoder: ConversationTokenizer, system_prompt: str | None,
               count_tokens: bool, image_placement: str = "front", exact_lengths: bool = False):
    """The source's index as a ``datasets.Dataset`` (memory-mapped): built and cached by the
    first process that asks for it (under ``datasets``' own file lock), mapped by the rest."""
    from datasets import Dataset

    key = index_fingerprint(source, counting_key(encoder, system_prompt, count_tokens, exact_lengths), image_placement)
    size = sum(f.stat().st_size for f in source.files)
    processes = min(len(source.files), os.cpu_count() or 1, MAX_PROCESSES) if size >= PARALLEL_BYTES else 1
    return Dataset.from_generator(_generate, features=features(), fingerprint=key,
                                  num_proc=processes if processes > 1 else None,
                                  gen_kwargs={"files": list(range(len(source.files))), "source": source,
                                              "encoder": encoder, "system_prompt": system_prompt,
                                              "count_tokens": count_tokens, "image_placement": image_placement,
                                              "exact_lengths": exact_lengths})
