"""A table of a results folder (`trials/` or `epochs/`) read as one dataset: one listing, each file's footer read
once, the files grouped by their schema, each group read in one multi-threaded pass of only the columns asked for
(and those the ownership check needs), the check (`bench.store.columns.not_ours`) made once per distinct schema and
over whole columns, never file by file. What a file holds and whether it is ours stays `bench.store.columns`'s;
where files live and what happens to one that is not ours, `bench.store.folder`'s.

A file is read the way `read_one` reads it (the unit the rules are stated in) wherever anything is odd: a footer
that cannot be read, a group that fails half-way, a file the column-wide check flags; so the rows and every problem
reported are what reading the files one by one gives, at a fraction of the cost: a 10,000-row folder read file by
file spent 5-6 ms of CPU a row in `pq.read_table` + `pl.from_arrow` + the check (`benchmarks/scale.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.store.columns import NAME_COLUMNS, STATUSES, TABLE_COLUMNS, column_kind, is_name, kind_fault, not_ours


def stem(path: str) -> str:
    """The trial id a result file's name says: `trials/<trial_id>.parquet`."""
    return path.rsplit("/", 1)[-1].removesuffix(".parquet")


def read_one(fs: Any, path: str) -> tuple[Any, str | None]:
    """One parquet file of a table as a polars frame, or None and what is wrong with it: unreadable, or not one of
    ours (`not_ours`)."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        frame = pl.from_arrow(pq.read_table(path, filesystem=fs))
    except (OSError, pa.ArrowException) as e:
        return None, f"unreadable: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    problem = not_ours(frame, path.rsplit("/", 2)[-2], stem(path))
    return (None, problem) if problem else (frame, None)


def read(fs: Any, paths: Sequence[str], table: str, columns: Sequence[str] | None = None
         ) -> tuple[Any, dict[str, str]]:
    """The rows of the files `paths` of `table` (in `paths`' order, the columns `columns` each file holds: all for
    None, none but what the check needs for ()) as one polars frame (empty if none), and each file that is not one of
    ours with what is wrong with it. The same rows, columns and problems as `read_one` over each file and a
    `pl.concat(how="diagonal_relaxed")` of the good ones, kept to `columns`."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.dataset as ds

    parquet = ds.ParquetFileFormat()
    problems: dict[str, str] = {}
    groups: dict[Any, list[tuple[int, Any]]] = {}  # schema -> (position, fragment), in `paths`' order
    for at, path in enumerate(paths):
        fragment = parquet.make_fragment(path, filesystem=fs)
        try:
            schema = fragment.metadata.schema.to_arrow_schema().remove_metadata()  # the footer, read once, kept
        except (OSError, pa.ArrowException):
            problems[path] = read_one(fs, path)[1] or "unreadable"
            continue
        groups.setdefault(schema, []).append((at, fragment))
    frames = []
    for schema, members in groups.items():
        frame, bad = _read_group(fs, parquet, schema, members, table, columns)
        problems |= bad
        if frame is not None:
            frames.append((members[0][0], frame))
    if not frames:
        return pl.DataFrame(), problems
    frames.sort(key=lambda f: f[0])  # the first file of each schema: the columns in the order files bring them
    whole = pl.concat([f for _, f in frames], how="diagonal_relaxed")
    whole = whole.sort("_at", maintain_order=True).drop("_at")
    return (whole if whole.width else pl.DataFrame()), problems


def _read_group(fs: Any, parquet: Any, schema: Any, members: list[tuple[int, Any]], table: str,
                columns: Sequence[str] | None) -> tuple[Any, dict[str, str]]:
    """The files of one schema, read in one pass (with each row's position in `_at`), less those the check flags;
    a group that cannot be read whole is read file by file (`read_one`), so the damaged file is found and named."""
    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.dataset as ds

    checked = set(TABLE_COLUMNS.get(table, {})) | set(NAME_COLUMNS)
    wanted = schema.names if columns is None else [c for c in schema.names if c in checked or c in columns]
    counts = [fragment.metadata.num_rows for _, fragment in members]
    try:
        arrow = ds.FileSystemDataset([f for _, f in members], schema, parquet, fs).to_table(columns=wanted)
    except (OSError, pa.ArrowException):
        return _one_by_one(fs, members, columns)
    frame = pl.from_arrow(arrow).with_columns(
        pl.Series("_at", np.repeat([at for at, _ in members], counts), dtype=pl.Int64),
        pl.Series("_stem", np.repeat([stem(f.path) for _, f in members], counts), dtype=pl.String))
    problems: dict[str, str] = {}
    suspects = _suspects(frame, table, counts, members)
    for at, fragment in members:
        if at in suspects:
            mine = frame.filter(pl.col("_at") == at).drop("_at", "_stem")
            if problem := not_ours(mine, fragment.path.rsplit("/", 2)[-2], stem(fragment.path)):
                problems[fragment.path] = problem
    if len(problems) == len(members):
        return None, problems
    if problems:
        frame = frame.filter(~pl.col("_at").is_in([at for at, f in members if f.path in problems]))
    keep = [c for c in frame.columns if c != "_stem" and (columns is None or c in columns or c == "_at")]
    return frame.select(keep), problems


def _suspects(frame: Any, table: str, counts: list[int], members: list[tuple[int, Any]]) -> set[int]:
    """The positions of the files `not_ours` could find fault with, found over whole columns: all of them where the
    schema itself is at fault (a column missing or of another kind); else those with another number of rows than a
    trial has, a name that is no NAME, a trial_id other than the file's name, or a status we do not write."""
    import polars as pl

    expected = TABLE_COLUMNS.get(table, {})
    if any(c not in frame.columns for c in expected) or any(kind_fault(table, c, t) for c, t in frame.schema.items()):
        return {at for at, _ in members}
    found = {at for (at, _), n in zip(members, counts, strict=True) if table == "trials" and n != 1}
    odd = pl.col("trial_id") != pl.col("_stem")
    for column, dtype in frame.schema.items():
        if column_kind(table, column) == "name" and dtype == pl.String:
            bad = [v for v in frame[column].drop_nulls().unique().to_list() if not is_name(v)]
            odd = odd | pl.col(column).is_in(bad)
    if "status" in expected:
        odd = odd | ~pl.col("status").is_in(STATUSES).fill_null(False)
    return found | set(frame.filter(odd.fill_null(True))["_at"].to_list())


def _one_by_one(fs: Any, members: list[tuple[int, Any]], columns: Sequence[str] | None) -> tuple[Any, dict[str, str]]:
    import polars as pl

    frames, problems = [], {}
    for at, fragment in members:
        frame, problem = read_one(fs, fragment.path)
        if problem:
            problems[fragment.path] = problem
        else:
            keep = [c for c in frame.columns if columns is None or c in columns]
            frames.append(frame.select(keep).with_columns(pl.lit(at, dtype=pl.Int64).alias("_at")))
    return (pl.concat(frames, how="diagonal_relaxed") if frames else None), problems
