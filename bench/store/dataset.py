"""A table of a results folder (`trials/` or `epochs/`) read as one dataset, with what each file holds read once.

Reading a 10,000-row folder file by file (`pq.read_table` + `pl.from_arrow` + the ownership check, each file on its
own) spent 5-6 ms of CPU a row, on every command. Here a table is read in three steps:
  1. one listing of the table's folder, each file with its identity (`key`: inode, size, modification and change
     times; on an object store, none);
  2. the files the table's compact copy (`index/<table>.parquet`, below) holds under that same identity, taken from
     it: one parquet file of every row, read for only the columns asked for;
  3. the others read as one dataset: each file's schema first (its footer), the files grouped by it, each group read
     in one multi-threaded polars pass of only the columns asked for (and those the ownership check needs), the
     check (`bench.store.columns.not_ours`) made once per distinct schema and over whole columns, never file by file;
     then kept in the copy, so that the next reader reads none of them.
The compact copy is a cache, never the truth: a row file added, removed or replaced by hand (another identity) is
read from its file, a copy that cannot be read is ignored, and a reader that read new files (or found files gone)
writes the copy anew, whole (to a temporary name, then renamed), where it can: a read-only folder is read all the
same. Files that are not ours never enter it: they are read, and named, on every read until `bench run` sets them
aside.

A file is read the way `read_one` reads it (the unit the rules are stated in) wherever anything is odd: a footer
that cannot be read, a group that fails half-way, a file the column-wide check flags; so the rows (every value, bit
for bit), their order (the files' names), the columns (the order files bring them in, their types as
`pl.concat(how="diagonal_relaxed")` makes them) and every problem reported are what reading the files one by one
gives. What a file holds and whether it is ours stays `bench.store.columns`'; where files live and what happens to one
that is not ours, `bench.store.folder`'s.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.store.columns import NAME_COLUMNS, STATUSES, TABLE_COLUMNS, column_kind, is_name, kind_fault, not_ours

INDEX = "index"  # the folder of the compact copies, one a table
# The compact copy's own columns: a row's file (its name), that file's identity, and its schema (an index into the
# copy's metadata); named so that no result column can take them.
FILE, KEY, SCHEMA = "__bench_file", "__bench_key", "__bench_schema"
AT = "__bench_at"  # a row's file's place in the listing, while the rows are put in order
PATH = "__bench_path"  # a row's file, as a group is read


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


def listing(store: Any, table: str) -> dict[str, str | None]:
    """Every `.parquet` file of the table's folder, in name order, each with its identity (None on an object store):
    a file rewritten, or replaced by another, has another."""
    import pyarrow.fs as pafs

    if not store.local:
        selector = pafs.FileSelector(store.path(table), allow_not_found=True)
        return dict.fromkeys(sorted(i.path for i in store.fs.get_file_info(selector) if i.path.endswith(".parquet")))
    try:
        entries = [e for e in os.scandir(store.path(table)) if e.name.endswith(".parquet")]
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {}
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            s = entry.stat(follow_symlinks=False)
            found[entry.path] = f"{s.st_ino}:{s.st_size}:{s.st_mtime_ns}:{s.st_ctime_ns}"
        except OSError:
            found[entry.path] = None
    return found


def read(store: Any, table: str, columns: Sequence[str] | None = None) -> tuple[Any, dict[str, str]]:
    """The rows of `table`'s files (in the files' name order, the columns `columns` each file holds: all for None,
    none but what the check needs for ()) as one polars frame (empty if none), and each file that is not one of
    ours with what is wrong with it: what `read_one` over each file and a `pl.concat(how="diagonal_relaxed")` of the
    good ones, kept to `columns`, gives."""
    import polars as pl

    files = listing(store, table)
    place = {p: at for at, p in enumerate(files)}
    copy = Copy.read(store, table, files, columns)
    fresh = [p for p in files if p.rsplit("/", 1)[-1] not in copy.names]
    renew = store.local and bool(fresh or copy.outdated)  # then the files read are read whole, to be kept in the copy
    groups, problems = _read_files(store, table, fresh, place, None if renew else columns)
    if renew and (groups or copy.outdated):
        (copy if columns is None else Copy.read(store, table, files, None)).write(store, table, files, groups)
    by_schema: dict[Any, list[Any]] = {}
    for schema, frame in [*groups, *copy.frames(files, columns)]:
        by_schema.setdefault(schema, []).append(
            frame if columns is None else frame.select(c for c in frame.columns if c in columns or c == AT))
    frames = []
    for parts in by_schema.values():
        frame = pl.concat(parts) if len(parts) > 1 else parts[0]
        frames.append((frame[AT].min(), frame))
    if not frames:
        return pl.DataFrame(), problems
    frames.sort(key=lambda f: f[0])  # the first file of each schema: the columns in the order files bring them
    whole = pl.concat([f for _, f in frames], how="diagonal_relaxed").sort(AT, maintain_order=True).drop(AT)
    return (whole if whole.width else pl.DataFrame()), problems


def schema_key(schema: Any) -> tuple[tuple[str, Any], ...]:
    """A file's polars schema as a key: its columns, in order, with their types."""
    return tuple(schema.items())


@dataclass
class Copy:
    """The compact copy of a table (`index/<table>.parquet`) as read: the rows of the files it holds under their
    present identity (`rows`, their names `names`), the schemas of those files (empty polars frames, by index) and
    whether it held a file that is gone or has changed since (`outdated`: then it is written anew)."""

    rows: Any = None
    names: frozenset[str] = frozenset()
    schemas: tuple[Any, ...] = ()
    outdated: bool = False

    @classmethod
    def read(cls, store: Any, table: str, files: dict[str, str | None], columns: Sequence[str] | None) -> Copy:
        """The copy's rows of the files it holds under their present identity, of `columns` only where given (and its
        own); nothing where there is no copy, or it cannot be read (then `outdated`: it is written anew)."""
        import polars as pl
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = store.path(INDEX, f"{table}.parquet")
        if not store.local or not os.path.isfile(path):
            return cls()
        if os.path.islink(path) or os.path.islink(store.path(INDEX)):  # not ours: never read through a link
            return cls(outdated=True)
        try:
            held = pq.read_schema(path)
            schemas = tuple(pl.read_ipc(io.BytesIO(base64.b64decode(s)))
                            for s in json.loads(held.metadata[b"bench.schemas"]))
            wanted = [c for c in held.names if columns is None or c in columns or c in (FILE, KEY, SCHEMA)]
            rows = pl.read_parquet(path, columns=wanted, glob=False)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException, pl.exceptions.PolarsError):
            return cls(outdated=True)
        # A row stays where its file is listed with the key it was read at (a file without a key is read again);
        # a filter, not a join, keeps the rows' order on every polars the lower bound admits.
        now = [f"{p.rsplit('/', 1)[-1]}\0{key}" for p, key in files.items() if key is not None]
        same = rows.filter((pl.col(FILE) + "\0" + pl.col(KEY)).is_in(now))
        return cls(same, frozenset(same[FILE].to_list()), schemas, same.height < rows.height)

    def frames(self, files: dict[str, str | None], columns: Sequence[str] | None) -> list[tuple[Any, Any]]:
        """The rows, as (schema key, frame) a schema: each file's columns as its file holds them, of its file's
        types, with its place in the listing (`AT`)."""
        import polars as pl

        if self.rows is None or self.rows.is_empty():
            return []
        listed = pl.Series([p.rsplit("/", 1)[-1] for p in files], dtype=pl.String)  # in name order
        rows = self.rows.with_columns(listed.search_sorted(self.rows[FILE]).cast(pl.Int64).alias(AT))
        out = []
        for (index,), part in rows.group_by(SCHEMA, maintain_order=True):
            types = self.schemas[index].schema
            names = [c for c in types if (columns is None or c in columns) and c in part.columns]
            out.append((schema_key(types), part.select(*(pl.col(c).cast(types[c]) for c in names), AT)))
        return out

    def write(self, store: Any, table: str, files: dict[str, str | None], groups: list[tuple[Any, Any]]) -> None:
        """The copy written anew: the rows it held of files still there and unchanged, and those just read (whole:
        `groups` was read for every column). A folder that refuses it is read without one."""
        import polars as pl
        import pyarrow as pa
        import pyarrow.parquet as pq

        schemas = list(self.schemas)
        known = {schema_key(s.schema): i for i, s in enumerate(schemas)}
        names = pl.Series([p.rsplit("/", 1)[-1] for p in files], dtype=pl.String)
        keys = pl.Series(list(files.values()), dtype=pl.String)
        parts = [] if self.rows is None or self.rows.is_empty() else [self.rows]
        for key, frame in groups:
            if key not in known:
                known[key] = len(schemas)
                schemas.append(frame.select(c for c, _ in key).clear())
            at = frame[AT].to_numpy()
            parts.append(frame.with_columns(names.gather(at).alias(FILE), keys.gather(at).alias(KEY),
                                            pl.lit(known[key], dtype=pl.Int64).alias(SCHEMA)).drop(AT))
        path = store.path(INDEX, f"{table}.parquet")
        if not parts or os.path.islink(path) or os.path.islink(store.path(INDEX)):
            return  # nothing to keep (a copy left as it was holds no file under its present identity), or a link
            # planted where the copy goes: left as it is (a reader changes nothing that is not its own)
        try:
            whole = pl.concat(parts, how="diagonal_relaxed").to_arrow().replace_schema_metadata(
                {"bench.schemas": json.dumps([base64.b64encode(_ipc(s)).decode() for s in schemas])})
            sink = pa.BufferOutputStream()
            pq.write_table(whole, sink)
            store.write_bytes(path, sink.getvalue().to_pybytes())
        except (OSError, pa.ArrowException, pl.exceptions.PolarsError):
            pass  # a read-only folder, a full disk: the next reader reads the files again


def _ipc(frame: Any) -> bytes:
    out = io.BytesIO()
    frame.write_ipc(out)
    return out.getvalue()


def _read_files(store: Any, table: str, paths: list[str], place: dict[str, int], columns: Sequence[str] | None
                ) -> tuple[list[tuple[Any, Any]], dict[str, str]]:
    """The files `paths`, grouped by schema (each footer read once), each group read in one pass: (schema key,
    frame with `AT`) a group with any good file, and each file that is not ours with what is wrong with it. On an
    object store, file by file."""
    import polars as pl

    if not store.local:
        frame, problems = _one_by_one(store.fs, paths, place, columns)
        return ([] if frame is None else [(None, frame)]), problems
    problems: dict[str, str] = {}
    groups: dict[Any, list[str]] = {}  # schema key -> paths, in the listing's order
    for path in paths:
        try:
            groups.setdefault(schema_key(pl.read_parquet_schema(path)), []).append(path)
        except (OSError, pl.exceptions.PolarsError):
            problems[path] = read_one(store.fs, path)[1] or "unreadable"
    out = []
    for key, members in groups.items():
        frame, bad = _read_group(store, key, members, place, table, columns)
        problems |= bad
        if frame is not None:
            out.append((key, frame))
    return out, problems


def _read_group(store: Any, key: tuple[tuple[str, Any], ...], paths: list[str], place: dict[str, int], table: str,
                columns: Sequence[str] | None) -> tuple[Any, dict[str, str]]:
    """The files of one schema, read in one pass (with each row's place in `AT`), less those the check flags; a
    group that cannot be read whole is read file by file (`read_one`), so the damaged file is found and named."""
    import polars as pl

    checked = set(TABLE_COLUMNS.get(table, {})) | set(NAME_COLUMNS)
    wanted = [c for c, _ in key if columns is None or c in checked or c in columns]
    try:
        frame = pl.scan_parquet(paths, glob=False, include_file_paths=PATH).select(*wanted, PATH).collect()
    except (OSError, pl.exceptions.PolarsError):
        return _one_by_one(store.fs, paths, place, columns)
    listed = pl.Series(list(place), dtype=pl.String)  # the listing, in name order
    frame = frame.with_columns(listed.search_sorted(frame[PATH]).cast(pl.Int64).alias(AT))
    problems: dict[str, str] = {}
    for path in _suspects(frame, table, key, paths):
        mine = frame.filter(pl.col(PATH) == path).drop(AT, PATH)
        if problem := not_ours(mine, path.rsplit("/", 2)[-2], stem(path)):
            problems[path] = problem
    if len(problems) == len(paths):
        return None, problems
    if problems:
        frame = frame.filter(~pl.col(PATH).is_in(list(problems)))
    return frame.select(c for c in frame.columns if c != PATH and (columns is None or c in columns or c == AT)), \
        problems


def _suspects(frame: Any, table: str, key: tuple[tuple[str, Any], ...], paths: list[str]) -> list[str]:
    """The files `not_ours` could find fault with, found over whole columns: all of them where the schema itself is
    at fault (a column missing or of another kind); else those with another number of rows than a trial has, a name
    that is no NAME, a trial_id other than the file's name, or a status we do not write."""
    import polars as pl

    expected = TABLE_COLUMNS.get(table, {})
    if any(c not in dict(key) for c in expected) or any(kind_fault(table, c, t) for c, t in key):
        return paths
    found = set()
    if table == "trials":
        counts = dict(frame.group_by(PATH).len().iter_rows())
        found = {p for p in paths if counts.get(p, 0) != 1}
    odd = pl.col("trial_id") != pl.col(PATH).str.split("/").list.last().str.strip_suffix(".parquet")
    for column, dtype in key:
        if column_kind(table, column) == "name" and dtype == pl.String:
            bad = [v for v in frame[column].drop_nulls().unique().to_list() if not is_name(v)]
            odd = odd | pl.col(column).is_in(bad)
    if "status" in expected:
        odd = odd | ~pl.col("status").is_in(STATUSES).fill_null(False)
    found |= set(frame.filter(odd.fill_null(True))[PATH].to_list())
    return [p for p in paths if p in found]


def _one_by_one(fs: Any, paths: list[str], place: dict[str, int], columns: Sequence[str] | None
                ) -> tuple[Any, dict[str, str]]:
    import polars as pl

    frames, problems = [], {}
    for path in paths:
        frame, problem = read_one(fs, path)
        if problem:
            problems[path] = problem
        else:
            keep = [c for c in frame.columns if columns is None or c in columns]
            frames.append(frame.select(keep).with_columns(pl.lit(place[path], dtype=pl.Int64).alias(AT)))
    return (pl.concat(frames, how="diagonal_relaxed") if frames else None), problems
