"""The launch check's data sources: what each mixture entry would meet at launch.

Owns reading a source as the run would, without loading a model: a JSON source's rows against
the row rules (``llava_norm.data.rows``) and a sample of their images in the image folder, every
parquet shard's footer and layout, the dataset card's row count, and a ``take`` that comes to no
row. ``llava_norm.train.preflight`` turns the problems into the check's lines; those marked
SKIPPABLE are warnings where ``data.on_bad_sample`` is skip, those marked NOTE warnings always.
"""

from __future__ import annotations

from pathlib import Path

from llava_norm.config_schema import ConfigError, DataSource, take_beyond_rows, take_count, take_takes_nothing
from llava_norm.data.conversation import FORMAT_CLASSES
from llava_norm.data.rows import BadSampleError, check_row, no_rows, read_entries
from llava_norm.data.sources import check_layout, resolve

IMAGE_SAMPLE = 64  # images of a JSON source looked for in its image folder
MAX_SHARD_LINES = 5  # unreadable shards named one by one; the rest are counted
SKIPPABLE = "(skippable) "  # marks a source problem that data.on_bad_sample: skip steps over
NOTE = "(note) "  # marks what the check says as a warning whatever the policy: the run goes on as asked


def source_problems(source: DataSource, key: str, prompt_format: str = "chat") -> tuple[list[str], int | None]:
    """(problems, rows it takes) of one mixture entry: a JSON source's rows and a sample of their
    images, a parquet source's footers. A problem the bad-sample policy can step over starts with
    SKIPPABLE."""
    try:
        resolved = resolve(source, key)
    except ConfigError as error:
        return [str(error)], None
    if resolved.kind == "parquet":
        import pyarrow.parquet as pq

        rows, problems, unreadable = 0, [], 0
        for path in resolved.files:
            try:
                reader = pq.ParquetFile(path)
            except Exception as error:  # noqa: BLE001 - any unreadable footer is the same problem
                unreadable += 1
                if unreadable <= MAX_SHARD_LINES:
                    problems.append(f"{SKIPPABLE}key '{key}': {path} cannot be read as parquet ({type(error).__name__}: "
                                    f"{str(error).splitlines()[0]}): a download cut short? Download it again")
                continue
            try:
                check_layout(reader, path)
                if reader.metadata.num_rows == 0:
                    raise no_rows(path)
            except BadSampleError as error:  # the run would drop the whole shard
                problems.append(f"{SKIPPABLE}key '{key}': {error}")
                continue
            rows += reader.metadata.num_rows
        if unreadable > MAX_SHARD_LINES:
            problems.append(f"{SKIPPABLE}key '{key}': {unreadable - MAX_SHARD_LINES} more unreadable shards")
        if resolved.files and rows == 0:  # every shard dropped or empty: skipping cannot help
            problems.append(f"key '{key}': none of its {len(resolved.files)} shard(s) holds a row the run can "
                            "read (above): this source would train nothing")
        taken = take_count(rows, source.take, f"{key}.take")
        if rows and not taken:
            problems.append(take_takes_nothing(source.take, rows, f"{key}.take"))
        if resolved.expected_rows is not None and not problems and rows != resolved.expected_rows:
            problems.append(f"{SKIPPABLE}key '{key}': the dataset card says {resolved.expected_rows} rows, the "
                            f"{len(resolved.files)} shards hold {rows}: a partial download? Download it again")
        return problems + _beyond(source.take, rows, key), taken  # the note last: it hides no problem
    problems, read = [], []
    for path in resolved.files:
        try:
            entries = read_entries(Path(path))
        except Exception as error:  # noqa: BLE001 - BadSampleError or OSError: the file as a whole
            problems.append(f"key '{key}': {error}")
            continue
        unreadable = [raw for _, raw in entries if isinstance(raw, BadSampleError)]
        if len(unreadable) == len(entries):  # not a few bad lines: the file is not JSONL (a JSON list named .jsonl?)
            problems.append(f"key '{key}': {path}: none of its {len(unreadable)} lines reads as a JSON row "
                            f"(first: {unreadable[0]})")
            continue
        read.append((path, entries))
    # the rows the run takes: the first of the files' rows, in file order (its take)
    total = sum(len(entries) for _, entries in read)
    left = take_count(total, source.take, f"{key}.take")
    problems += _beyond(source.take, total, key)
    if total and not left:  # the source would add nothing to the mixture, unsaid
        problems.append(take_takes_nothing(source.take, total, f"{key}.take"))
    bad, passed, rows = [], 0, 0
    for path, entries in read:
        taken, left = entries[:left], max(0, left - len(entries))
        rows += sum(1 for _, raw in taken if not isinstance(raw, BadSampleError))
        for index, (line, raw) in enumerate(taken):
            try:
                _check(raw, str(path), index, None if line is None else f"line {line}", prompt_format)
                passed += 1
            except BadSampleError as error:
                bad.append(error)
        problems += _image_problems(key, resolved, path, [raw for _, raw in taken])
    if bad and not passed:
        problems.append(f"key '{key}': none of the {len(bad)} rows the run takes passes the row rules (first: "
                        f"{bad[0]}): this source would train nothing")
    else:
        problems += [f"{SKIPPABLE}key '{key}': {error}" for error in bad[:MAX_SHARD_LINES]]
        if len(bad) > MAX_SHARD_LINES:
            problems.append(f"{SKIPPABLE}key '{key}': {len(bad) - MAX_SHARD_LINES} more rows break the row rules")
    return problems, rows  # the rows the run takes, read (before the row rules)


def _beyond(take: str, total: int, key: str) -> list[str]:
    """A ``first:N`` past the rows the source holds, as a note."""
    note = take_beyond_rows(take, total, f"{key}.take")
    return [NOTE + note] if note else []


def _check(raw, path: str, index: int, position: str | None, prompt_format: str) -> None:
    """One row as the index build checks it (``data.index``): the row rules, then the prompt
    format's (the plain format's caption after the first user turn); BadSampleError if bad."""
    if isinstance(raw, BadSampleError):  # a JSONL line that does not read
        raise raw
    check_row(raw, path, index, position, format_problem=FORMAT_CLASSES[prompt_format].row_problem)


def _image_problems(key: str, resolved, path, taken: list) -> list[str]:
    """A sample of the taken rows' images looked for where the dataset reads them."""
    with_image = [r["image"] for r in taken if isinstance(r, dict) and isinstance(r.get("image"), str)]
    if not with_image:
        return []
    step = max(1, len(with_image) // IMAGE_SAMPLE)
    sample = with_image[::step][:IMAGE_SAMPLE]
    # without an image_folder the dataset reads images beside the file (data.dataset)
    folder = Path(resolved.image_folder).expanduser() if resolved.image_folder else Path(path).parent
    missing = [name for name in sample if not (folder / name).is_file()]
    if len(missing) == len(sample):
        unset = "" if resolved.image_folder else " (image_folder is not set: images are read beside the file)"
        return [f"key '{key}.image_folder': none of {len(sample)} sampled images of {path} is under {folder}{unset} "
                f"(first looked for: {missing[0]}): the wrong folder, or the images not unpacked"]
    if missing:  # rows the run skips when drawn (or, under error, the first drawn stops it)
        return [f"{SKIPPABLE}key '{key}.image_folder': {len(missing)} of {len(sample)} sampled images of {path} are "
                f"missing under {folder} (first looked for: {missing[0]}): images not all unpacked?"]
    return []
