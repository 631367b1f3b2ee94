"""Task loaders: parquet / jsonl files, bundled suite splits and in-memory lists → ``list[Task]``.

Two row layouts are understood.

**verl layout** (the original DPH-RL files load unchanged), used when no ``prompt_format`` is given:

=================  ==========================================================================
column             content
=================  ==========================================================================
``data_source``    name of the data set, e.g. ``"bird"``
``prompt``         list of chat messages ``{"role", "content"}`` (a plain string is accepted and
                   becomes one user message)
``reward_model``   ``{"style": ..., "ground_truth": ...}``; the ground truth depends on the task:
                   SQL ``{"db_id", "gold_sql", "cmp_method"}``, math the answer string (or number)
``id``             optional; when absent ``extra_info.index`` is used, else the row number
``extra_info``     optional; kept in ``Task.meta["extra_info"]``
=================  ==========================================================================

**flat layout**, used when a ``prompt_format`` is given (the registry's generic tasks): any columns;
the prompt is ``prompt_format.format(**row)`` (or ``prompt_format(row)`` for a callable) and the
ground truth is ``row[ground_truth_field]``. ``data_source`` and ``id`` are read when present
(defaults: the file's stem, or ``"custom"`` for in-memory lists, and the row number).

A file path or split name may end in a row range, ``"sql_synth/train[:256]"`` or
``"dapo_math.parquet[1000:2000]"`` (Python slice bounds, no step): the tasks of those rows only,
for a quick run on part of a data set. The rows keep their ids, so pre-sampling and evaluation
results name the same tasks as with the whole file.

Error messages name the file and the place: a row number (from 0) for parquet files and lists, the
line of the file (from 1, as editors count) and the row number for jsonl files.
"""

from __future__ import annotations

import decimal
import importlib
import json
import math
import numbers
import os
import re
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from rllib_dph.envs.base import Task

#: Comparison methods of the SQL verifier (the keys of ``rllib_dph.envs.sql.COMPARATORS``).
SQL_CMP_METHODS = ("bird", "spider")
DEFAULT_SQL_CMP_METHOD = "bird"
#: File suffixes read by :func:`load_tasks`.
FILE_SUFFIXES = (".parquet", ".jsonl")
#: ``"<file or split>[start:stop]"``: a row range of a data set (see the module docstring).
ROW_RANGE = re.compile(r"^(?P<name>.+)\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")
#: Columns every verl-layout file must have.
VERL_COLUMNS = ("data_source", "prompt", "reward_model")

PromptFormat = str | Callable[[Mapping[str, Any]], "str | Sequence[Mapping[str, str]]"]


@dataclass
class _Context:
    """Everything row conversion needs to know about one ``load_tasks`` call."""

    source: str  # how error messages name the data: a file path or "data (an in-memory list)"
    lines: Sequence[int] | None  # jsonl: the file's line number of each row; else None
    task: str
    db_root: str
    default_data_source: str
    prompt_format: PromptFormat | None
    ground_truth_field: str
    system_prompt: str | None
    checked_db_paths: dict[str, str] = field(default_factory=dict)  # db_id -> absolute path

    def place(self, row: int) -> str:
        """Where row ``row`` is: ``"row 3"``, or ``"line 5 (row 3)"`` for a jsonl file."""
        return f"row {row}" if self.lines is None else f"line {self.lines[row]} (row {row})"

    def error(self, row: int, column: str, expected: str, got: Any) -> ValueError:
        """A data error naming the source, the row, the field and what was expected."""
        shown = repr(got)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        return ValueError(
            f"{self.source}: {self.place(row)}, field '{column}': expected {expected}, "
            f"got {shown}."
        )


def load_tasks(
    data: str | os.PathLike | Sequence[Task | Mapping[str, Any]],
    *,
    task: str,
    db_root: str | os.PathLike | None = None,
    prompt_format: PromptFormat | None = None,
    ground_truth_field: str = "answer",
    system_prompt: str | None = None,
) -> list[Task]:
    """Loads the tasks of a data set.

    Args:
        data: One of
            - a path to a ``.parquet`` file (read with pyarrow) or a ``.jsonl`` file (one JSON
              object per line, read line by line);
            - the name of a bundled suite split, e.g. ``"sql_synth/train"`` (see ``rllib_dph.envs.suites``);
            - either of those with a row range, ``"sql_synth/train[:256]"`` (Python slice bounds);
            - a list of :class:`Task` objects (kept as they are) and/or row dicts (converted like
              file rows).
        task: How to read the ground truth: ``"sql"``, ``"math"`` or ``"generic"`` (kept as is).
        db_root: SQL only: folder the ``db_id`` paths are relative to. Defaults to the data file's
            folder (the current directory for in-memory lists). Ignored for suite splits, whose
            tasks carry absolute database paths.
        prompt_format: Selects the flat layout: a ``str.format`` template over the row's fields
            (e.g. ``"Reverse: {question}"``) or a function ``row -> str | list of messages``.
            ``None`` selects the verl layout.
        ground_truth_field: Flat layout only: the field holding the ground truth.
        system_prompt: When given, prepended to every prompt as a system message.

    Returns:
        The tasks in file order.

    Raises:
        ValueError: A missing column, a missing database file or a malformed row; the message names
            the file, the row (from 0; for jsonl also the file's line, from 1) and the field.
        FileNotFoundError: ``data`` names a file that does not exist.
    """
    if task not in GROUND_TRUTH_READERS:
        raise ValueError(
            f"task={task!r} is not a known task type; use one of {sorted(GROUND_TRUTH_READERS)}."
        )
    if prompt_format is not None:
        check_prompt_format(prompt_format)
    layout = {
        "task": task,
        "prompt_format": prompt_format,
        "ground_truth_field": ground_truth_field,
        "system_prompt": system_prompt,
    }
    if isinstance(data, (str, os.PathLike)):
        return _load_named(os.fspath(data), db_root, layout)
    if isinstance(data, Sequence):
        return _load_list(data, db_root, layout)
    raise TypeError(
        f"data must be a .parquet/.jsonl path, a suite split name or a list of tasks/dicts; "
        f"got a {type(data).__name__}."
    )


def _load_named(path: str, db_root: str | os.PathLike | None, layout: dict[str, Any]) -> list[Task]:
    """The tasks of a file path or suite split name, either with an optional row range."""
    ranged = ROW_RANGE.match(path)
    if ranged:
        return _row_range(_load_named(ranged["name"], db_root, layout), path, ranged)
    if not path.endswith(FILE_SUFFIXES):
        return _load_suite(path)
    return _load_file(path, db_root, layout)


def _row_range(tasks: list[Task], data: str, ranged: re.Match) -> list[Task]:
    """The tasks of ``data``'s row range (``ranged``: its :data:`ROW_RANGE` match)."""
    bounds = slice(*(int(ranged[b]) if ranged[b] else None for b in ("start", "stop")))
    chosen = tasks[bounds]
    if not chosen:
        raise ValueError(
            f"data={data!r}: the row range selects no row of {ranged['name']!r} ({len(tasks)} rows); "
            f"give bounds inside 0..{len(tasks)}, e.g. '{ranged['name']}[:{min(len(tasks), 256)}]'."
        )
    return chosen


def _load_file(path: str, db_root: str | os.PathLike | None, layout: dict[str, Any]) -> list[Task]:
    """The tasks of a ``.parquet`` or ``.jsonl`` file.

    Args:
        path: The file.
        db_root: SQL only: the folder of the databases (default: the file's folder).
        layout: ``task``, ``prompt_format``, ``ground_truth_field`` and ``system_prompt`` of
            :func:`load_tasks`.
    """
    columns, rows, lines = _read_file(path, layout["prompt_format"], layout["ground_truth_field"])
    ctx = _Context(
        source=path,
        lines=lines,
        db_root=os.path.abspath(db_root or os.path.dirname(os.path.abspath(path))),
        default_data_source=os.path.splitext(os.path.basename(path))[0],
        **layout,
    )
    _check_columns(ctx, columns)
    return _unique_ids(ctx, [_row_to_task(ctx, i, row) for i, row in enumerate(rows)])


def _load_list(
    data: Sequence[Task | Mapping[str, Any]], db_root: str | os.PathLike | None, layout: dict[str, Any]
) -> list[Task]:
    """The tasks of an in-memory list of :class:`Task` objects and/or row dicts.

    Args:
        data: The list.
        db_root: SQL only: the folder of the databases (default: the current directory).
        layout: ``task``, ``prompt_format``, ``ground_truth_field`` and ``system_prompt`` of
            :func:`load_tasks`.
    """
    ctx = _Context(
        source="data (an in-memory list)",
        lines=None,
        db_root=os.path.abspath(db_root or os.getcwd()),
        default_data_source="custom",
        **layout,
    )
    return _unique_ids(ctx, [_item_to_task(ctx, i, item) for i, item in enumerate(data)])


def _unique_ids(ctx: _Context, tasks: list[Task]) -> list[Task]:
    """``tasks``, or ValueError naming the first two rows that share an id (results,
    pre-sampled rows and evaluations are stored by task id)."""
    seen: dict[str, int] = {}
    for i, task in enumerate(tasks):
        first = seen.setdefault(task.id, i)
        if first != i:
            raise ValueError(
                f"{ctx.source}: {ctx.place(i)}, field 'id': the task id {task.id!r} is already the id of "
                f"{ctx.place(first)}; task ids must be unique (a row without an id takes its row "
                "number): give each row its own id."
            )
    return tasks


def check_prompt_format(prompt_format: PromptFormat) -> tuple[str, ...]:
    """Checks a prompt format and returns the row fields a template uses (empty for a callable).

    Raises:
        ValueError: A template with positional fields (``{}``, ``{0}``) or bad syntax.
        TypeError: Neither a string nor a callable.
    """
    if callable(prompt_format):
        return ()
    if not isinstance(prompt_format, str):
        raise TypeError(
            f"prompt_format must be a str.format template or a function row -> prompt; "
            f"got a {type(prompt_format).__name__}."
        )
    try:
        parsed = list(string.Formatter().parse(prompt_format))
    except ValueError as e:
        raise ValueError(
            f"prompt_format={prompt_format!r} is not a valid str.format template: {e}."
        ) from e
    fields = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        base = re.split(r"[.\[]", name, maxsplit=1)[0]
        if base == "" or base.isdigit():
            raise ValueError(
                f"prompt_format={prompt_format!r} uses a positional field; name the row fields, "
                "e.g. 'Reverse: {question}'."
            )
        fields.append(base)
    return tuple(dict.fromkeys(fields))


def _load_suite(name: str) -> list[Task]:
    try:
        suites = importlib.import_module("rllib_dph.envs.suites")
    except ModuleNotFoundError as e:
        if e.name != "rllib_dph.envs.suites":
            raise
        raise ValueError(
            f"data={name!r} does not end in {' or '.join(FILE_SUFFIXES)}, so it was read as a "
            "bundled suite split, but the bundled suites (rllib_dph.envs.suites) are not installed."
        ) from e
    if not suites.is_split_name(name):
        raise ValueError(
            f"data={name!r} is neither a file path ending in {' or '.join(FILE_SUFFIXES)} nor a "
            f"bundled suite split; bundled splits: {', '.join(suites.SPLITS)}, or "
            "sql_synth/train@ties=<share>."
        )
    return list(suites.load_split(name))


def _read_file(
    path: str, prompt_format: PromptFormat | None, ground_truth_field: str
) -> tuple[list[str], list[dict], list[int] | None]:
    """Reads the columns a conversion needs.

    Returns:
        All column names, the rows as dicts (selected columns only; a missing one is None), and
        for a jsonl file the line number of each row (None for parquet).
    """
    if os.path.isdir(path):
        raise ValueError(
            f"data file {path} is a folder, not a file; give one {' or '.join(FILE_SUFFIXES)} file (a "
            "data set written as a folder of parts: one part, or the parts merged into one file)."
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path} does not exist.")
    if path.endswith(".parquet"):
        columns, rows, lines = *_read_parquet(path), None
    else:
        columns, rows, lines = _read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: the file has no rows; give at least one task.")
    if prompt_format is None:
        wanted = [*VERL_COLUMNS, "id", "extra_info"]
    elif callable(prompt_format):
        wanted = columns
    else:
        wanted = [*check_prompt_format(prompt_format), ground_truth_field, "data_source", "id"]
    selected = [c for c in dict.fromkeys(wanted) if c in columns]
    return columns, [{c: row.get(c) for c in selected} for row in rows], lines


def _read_parquet(path: str) -> tuple[list[str], list[dict]]:
    """All column names and the rows of a parquet file (read with pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet

    try:
        table = pyarrow.parquet.read_table(path)
    except pa.ArrowException as e:
        raise ValueError(f"{path}: pyarrow cannot read this file ({e}); expected parquet.") from e
    return table.column_names, table.to_pylist()


def _read_jsonl(path: str) -> tuple[list[str], list[dict], list[int]]:
    """Reads a JSON-lines file: one JSON object per non-blank line.

    Read line by line (not with pyarrow, whose errors count rows within a block of the file and
    which needs every field to keep one type across rows), so that an error names the line.

    Returns:
        The column names (every key, in order of first appearance), the rows, and the line number
        (from 1) of each row.
    """
    columns: dict[str, None] = {}
    rows: list[dict] = []
    lines: list[int] = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}: line {number}: invalid UTF-8 at byte {e.start} of the line "
                    f"({e.reason}: {raw[e.start:e.end]!r}); the file must be UTF-8 encoded."
                ) from None
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError as e:  # json.JSONDecodeError, or a number too long to convert
                raise ValueError(
                    f"{path}: line {number}: not valid JSON ({e}); expected one JSON object "
                    "per line."
                ) from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}: line {number}: expected a JSON object {{...}}, got a JSON "
                    f"{type(row).__name__}."
                )
            columns.update(dict.fromkeys(row))
            rows.append(row)
            lines.append(number)
    return list(columns), rows, lines


def _check_columns(ctx: _Context, columns: Sequence[str]) -> None:
    if ctx.prompt_format is None:
        required = list(VERL_COLUMNS)
        layout = "the verl layout (data_source, prompt, reward_model[, id])"
    else:
        required = [*check_prompt_format(ctx.prompt_format), ctx.ground_truth_field]
        layout = f"the fields of prompt_format={ctx.prompt_format!r} and ground_truth_field"
    for name in required:
        if name not in columns:
            raise ValueError(
                f"{ctx.source}: missing column '{name}', needed by {layout}; "
                f"the file has columns {list(columns)}."
            )


def _item_to_task(ctx: _Context, i: int, item: Any) -> Task:
    if isinstance(item, Task):
        return item
    if not isinstance(item, Mapping):
        raise ctx.error(i, "<row>", "a Task or a dict", item)
    return _row_to_task(ctx, i, item)


def _required(ctx: _Context, i: int, row: Mapping[str, Any], name: str) -> Any:
    if name not in row:
        raise ValueError(
            f"{ctx.source}: {ctx.place(i)}: missing field '{name}'; the row has fields {list(row)}."
        )
    return row[name]


def _check_text(ctx: _Context, i: int, column: str, value: Any) -> None:
    """Raises ValueError naming the row and field of a string that is not text: a lone UTF-16
    surrogate (a JSON ``\\ud800`` escape of half a pair), which no tokenizer or file can encode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{ctx.source}: {ctx.place(i)}, field '{column}': a lone surrogate "
                f"({value[e.start]!r}) at character {e.start}, which is not text (half of a UTF-16 "
                "pair, e.g. a JSON \\ud83d escape without its partner); write the character whole."
            ) from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_text(ctx, i, f"{column}.{key}" if column else str(key), item)
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            _check_text(ctx, i, f"{column}[{k}]", item)


def _row_to_task(ctx: _Context, i: int, row: Mapping[str, Any]) -> Task:
    _check_text(ctx, i, "", row)
    if ctx.prompt_format is None:
        return _verl_row_to_task(ctx, i, row)
    return _flat_row_to_task(ctx, i, row)


def _verl_row_to_task(ctx: _Context, i: int, row: Mapping[str, Any]) -> Task:
    data_source = _required(ctx, i, row, "data_source")
    if not isinstance(data_source, str) or not data_source:
        raise ctx.error(i, "data_source", "a non-empty string", data_source)
    messages = _messages(ctx, i, "prompt", _required(ctx, i, row, "prompt"))
    reward_model = _required(ctx, i, row, "reward_model")
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise ctx.error(i, "reward_model", 'a struct {"style", "ground_truth"}', reward_model)
    read_truth = GROUND_TRUTH_READERS[ctx.task]
    ground_truth = read_truth(ctx, i, "reward_model.ground_truth", reward_model["ground_truth"])
    extra_info = row.get("extra_info")
    task_id = row.get("id")
    if task_id is None and isinstance(extra_info, Mapping):
        task_id = extra_info.get("index")
    meta: dict[str, Any] = {}
    if reward_model.get("style") is not None:
        meta["reward_style"] = reward_model["style"]
    if extra_info is not None:
        meta["extra_info"] = extra_info
    return Task(
        id=_task_id(ctx, i, "id" if row.get("id") is not None else "extra_info.index", task_id),
        data_source=data_source,
        messages=messages,
        ground_truth=ground_truth,
        meta=meta,
    )


def _flat_row_to_task(ctx: _Context, i: int, row: Mapping[str, Any]) -> Task:
    fmt = ctx.prompt_format
    if callable(fmt):
        try:
            prompt = fmt(row)
        except Exception as e:
            raise ValueError(
                f"{ctx.source}: {ctx.place(i)}: prompt_format(row) raised {type(e).__name__}: {e}"
            ) from e
    else:
        for name in check_prompt_format(fmt):
            _required(ctx, i, row, name)
        try:
            prompt = fmt.format_map(row)
        except (KeyError, IndexError, AttributeError, ValueError) as e:
            raise ValueError(
                f"{ctx.source}: {ctx.place(i)}: prompt_format={fmt!r} cannot format this row: {e!r}"
            ) from e
    messages = _messages(ctx, i, "prompt_format(row)", prompt)
    raw_truth = _required(ctx, i, row, ctx.ground_truth_field)
    ground_truth = GROUND_TRUTH_READERS[ctx.task](ctx, i, ctx.ground_truth_field, raw_truth)
    data_source = row.get("data_source") or ctx.default_data_source
    task_id = row.get("id")
    return Task(
        id=_task_id(ctx, i, "id", task_id),
        data_source=str(data_source),
        messages=messages,
        ground_truth=ground_truth,
    )


def _task_id(ctx: _Context, i: int, column: str, value: Any) -> str:
    """The task id of row ``i``: its ``value`` (a non-empty string, or an integer, also one
    stored as a float by a column with nulls: ``3.0`` is ``"3"``), else the row number."""
    if value is None:
        return str(i)
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    raise ctx.error(i, column, "the task id as a non-empty string or an integer", value)


def _messages(ctx: _Context, i: int, column: str, prompt: Any) -> tuple[dict[str, str], ...]:
    """Validates a prompt (a string or a list of chat messages) and returns it as messages."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, Iterable) and not isinstance(prompt, Mapping):
        messages = list(prompt)
        if not messages:
            raise ctx.error(i, column, "at least one chat message", prompt)
        for k, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise ctx.error(i, f"{column}[{k}]", 'a message {"role": str, "content": str}', m)
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or not role:
                raise ctx.error(i, f"{column}[{k}].role", "a non-empty string", role)
            if not isinstance(content, str):
                raise ctx.error(i, f"{column}[{k}].content", "a string", content)
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    else:
        raise ctx.error(i, column, "a string or a list of chat messages {role, content}", prompt)
    if ctx.system_prompt is not None:
        messages.insert(0, {"role": "system", "content": ctx.system_prompt})
    return tuple(messages)


def number_text(value: numbers.Real | decimal.Decimal) -> str:
    """A gold number as the text a checker reads back as the same number: an integer's digits,
    a fraction as ``p/q``, a float's shortest round-trip digits (of its own precision: a NumPy
    ``float32`` 0.1 is ``"0.1"``) written out positionally, never in exponent form (``1e-05``
    gives ``"0.00001"``, which Math-Verify cannot misread as ``1 * e - 5``; ``42.0`` gives
    ``"42"``; ``1.5e+300`` gives ``"15"`` and 299 zeros); a ``Decimal`` as its exact digits.

    Raises:
        ValueError: ``value`` is NaN or infinite (no answer equals it) or a bool.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a bool, not a number")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Rational):
        return f"{value.numerator}/{value.denominator}"
    if isinstance(value, decimal.Decimal):
        exact = value
    else:
        number = float(value)
        exact = decimal.Decimal(repr(number) if isinstance(value, float) else str(value))
    if not exact.is_finite():
        raise ValueError(f"{value} is not a finite number; no answer can equal it")
    text = format(exact, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _math_ground_truth(ctx: _Context, i: int, column: str, value: Any) -> str:
    """The gold answer as a non-empty string; a number is written by :func:`number_text`
    (``42.0`` becomes ``"42"``, ``1e-05`` ``"0.00001"``); NaN, infinity and None are refused."""
    if isinstance(value, (numbers.Real, decimal.Decimal)) and not isinstance(value, bool):
        try:
            return number_text(value)
        except ValueError:
            raise ctx.error(i, column, "the gold answer as a non-empty string or a finite number", value) from None
    if not isinstance(value, str) or not value.strip():
        raise ctx.error(i, column, "the gold answer as a non-empty string or a number", value)
    return value


def _sql_ground_truth(ctx: _Context, i: int, column: str, value: Any) -> dict[str, str]:
    """``{"db_id", "gold_sql", "cmp_method"}`` → the same plus ``db_path`` (absolute, exists)."""
    if not isinstance(value, Mapping):
        raise ctx.error(i, column, 'a struct {"db_id", "gold_sql", "cmp_method"}', value)
    db_id = value.get("db_id")
    if not isinstance(db_id, str) or not db_id:
        raise ctx.error(i, f"{column}.db_id", "the SQLite file's path relative to db_root", db_id)
    gold_sql = value.get("gold_sql")
    if not isinstance(gold_sql, str) or not gold_sql.strip():
        raise ctx.error(i, f"{column}.gold_sql", "a non-empty SQL string", gold_sql)
    cmp_method = value.get("cmp_method") or DEFAULT_SQL_CMP_METHOD
    if cmp_method not in SQL_CMP_METHODS:
        expected = f"one of {SQL_CMP_METHODS} (or null for {DEFAULT_SQL_CMP_METHOD!r})"
        raise ctx.error(i, f"{column}.cmp_method", expected, cmp_method)
    db_path = ctx.checked_db_paths.get(db_id)
    if db_path is None:
        db_path = os.path.normpath(os.path.join(ctx.db_root, db_id))
        if os.path.isabs(db_id) or os.path.commonpath([ctx.db_root, db_path]) != ctx.db_root:
            raise ValueError(
                f"{ctx.source}: {ctx.place(i)}, field '{column}.db_id': db_id {db_id!r} resolves "
                f"to {db_path}, outside db_root {ctx.db_root}; a db_id must be a path relative to "
                "db_root, without '..' leaving it."
            )
        if os.path.isdir(db_path):
            raise ValueError(
                f"{ctx.source}: {ctx.place(i)}, field '{column}.db_id': {db_path} is a folder, not "
                f"a SQLite database file (db_id {db_id!r} resolved against db_root {ctx.db_root}); "
                "give the path of the database file."
            )
        if not os.path.isfile(db_path):
            raise ValueError(
                f"{ctx.source}: {ctx.place(i)}, field '{column}.db_id': database file {db_path} "
                f"does not exist (db_id {db_id!r} resolved against db_root {ctx.db_root}); pass "
                "db_root= the folder that holds the databases."
            )
        ctx.checked_db_paths[db_id] = db_path
    return {"db_id": db_id, "db_path": db_path, "gold_sql": gold_sql, "cmp_method": cmp_method}


def _generic_ground_truth(ctx: _Context, i: int, column: str, value: Any) -> Any:
    """Any non-null value; the registered verifier function interprets it."""
    if value is None:
        raise ctx.error(i, column, "a ground truth value", value)
    return value


#: How each task type reads and validates its ground truth: ``(ctx, row, field, value) -> truth``.
GROUND_TRUTH_READERS: dict[str, Callable[[_Context, int, str, Any], Any]] = {
    "math": _math_ground_truth,
    "sql": _sql_ground_truth,
    "generic": _generic_ground_truth,
}
