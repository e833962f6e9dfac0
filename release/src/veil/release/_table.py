"""Tables: a mapping column name -> numpy array of strings, one entry per record, rows aligned.

Everything in veil.release takes and returns this plain shape (a ``dict`` keeps column order),
so a pandas user passes ``{c: df[c].astype(str).to_numpy() for c in df}`` and gets arrays back.
CSV files are read and written with the standard library: a header row, then one row per record;
values are kept as text, exactly as written.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ._errors import TableError

__all__ = ["Table", "as_table", "read_csv", "write_csv", "require_columns", "sorted_categories", "encode", "combine"]

Table = dict[str, np.ndarray]


def as_table(table: Mapping[str, Sequence[object] | np.ndarray]) -> Table:
    """Validate and copy a table: string arrays, all of one length, at least one column."""
    if not table:
        raise TableError("the table has no columns.")
    out: Table = {}
    length = None
    for name, column in table.items():
        arr = np.asarray(column)
        if arr.ndim != 1:
            raise TableError(f"column {name!r} is not one-dimensional.")
        arr = arr.astype(str)
        if length is None:
            length = arr.size
        elif arr.size != length:
            raise TableError(f"column {name!r} has {arr.size} values, but the first column has {length}.")
        out[str(name)] = arr
    return out


def read_csv(path: str | Path) -> Table:
    """Read a CSV file with a header row; every row must have one value per header column."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise TableError(f"{path} is empty: a header row naming the columns is needed.")
            names = [h.strip() for h in header]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise TableError(f"{path}: column {duplicates[0]!r} appears twice in the header.")
            rows = []
            for row in reader:
                if not row:
                    continue
                if len(row) != len(names):
                    raise TableError(
                        f"{path}, line {reader.line_num}: {len(row)} values where the header has {len(names)} columns."
                    )
                rows.append(row)
    except OSError as err:
        raise TableError(f"cannot read {path}: {err.strerror or err}.") from None
    except UnicodeDecodeError:
        raise TableError(f"{path} is not UTF-8 text.") from None
    if not rows:
        raise TableError(f"{path} has a header but no records.")
    columns = list(zip(*rows))
    return {name: np.array(col, dtype=str) for name, col in zip(names, columns)}


def write_csv(path: str | Path, table: Mapping[str, np.ndarray]) -> None:
    path = Path(path)
    names = list(table)
    try:
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(names)
            writer.writerows(zip(*(table[n].tolist() for n in names)))
    except OSError as err:
        raise TableError(f"cannot write {path}: {err.strerror or err}.") from None


def require_columns(table: Mapping[str, np.ndarray], columns: Sequence[str], what: str = "column") -> None:
    for name in columns:
        if name not in table:
            known = ", ".join(table)
            raise TableError(f"{what} {name!r} is not in the table (its columns: {known}).")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def sorted_categories(values: np.ndarray) -> np.ndarray:
    """The distinct values, in numeric order when every one is a number, else in text order."""
    cats = np.unique(np.asarray(values, dtype=str))
    numbers = [_number(c) for c in cats.tolist()]
    numbers = [None if x is None or x != x else x for x in numbers]  # "nan" is text here
    if cats.size and all(x is not None for x in numbers):
        order = np.argsort(np.array(numbers, dtype=np.float64), kind="stable")
        return cats[order]
    return cats


def encode(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(categories, codes): the column's distinct values in sorted_categories order and each
    record's index into them."""
    text_order, codes = np.unique(np.asarray(values, dtype=str), return_inverse=True)
    cats = sorted_categories(text_order)
    where = {v: i for i, v in enumerate(cats.tolist())}
    remap = np.array([where[v] for v in text_order.tolist()], dtype=np.int64)
    return cats, remap[codes.reshape(-1)]


def combine(codes: Sequence[np.ndarray], sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(cells, cell_of_record): the distinct combinations of several code columns (rows of
    ``cells``, sorted) and each record's index among them."""
    stacked = np.stack([np.asarray(c, dtype=np.int64) for c in codes], axis=1)
    if float(np.prod([max(int(s), 1) for s in sizes], dtype=np.float64)) < 2.0**62:
        flat = np.ravel_multi_index(tuple(stacked.T), tuple(max(int(s), 1) for s in sizes))
        keys, cell = np.unique(flat, return_inverse=True)
        cells = np.stack(np.unravel_index(keys, tuple(max(int(s), 1) for s in sizes)), axis=1)
        return cells.astype(np.int64), cell.reshape(-1)
    cells, cell = np.unique(stacked, axis=0, return_inverse=True)
    return cells, cell.reshape(-1)
