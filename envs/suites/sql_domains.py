"""Database domains of the synthetic SQL suite and the deterministic generation of their data.

Every domain has two tables: a *parent* table (e.g. ``stadium``) and a *child* table (e.g.
``singer``) whose foreign key points at the parent. Each table has an integer primary key, a
unique name column, one categorical text column and one or two integer columns. Column names are
unique within a domain (except the foreign key, which repeats the parent's key), so a query over a
join can be wrapped in a sub-query or CTE without renaming columns.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass

_SYLLABLES = (
    "ka", "lo", "mi", "ren", "tor", "sa", "vel", "ni", "dor", "ba", "le", "mar",
    "fi", "go", "ru", "tan", "ve", "zo", "pa", "lin", "cor", "da", "mo", "sel",
)


@dataclass(frozen=True)
class Column:
    """One non-key column of a table.

    Attributes:
        name: SQL column name.
        nl: How questions name the column (e.g. ``"record sales"``).
        values: For a categorical text column, the values it takes; empty for an integer column.
        low: Smallest value of an integer column.
        high: Largest value of an integer column.
        unique: Whether the integer values are all different (needed for ORDER BY ... LIMIT
            questions, whose answer must not depend on how ties are broken).
        summable: Whether a total makes sense (not for years); SUM questions skip it otherwise.
    """

    name: str
    nl: str
    values: tuple[str, ...] = ()
    low: int = 0
    high: int = 0
    unique: bool = False
    summable: bool = True

    @property
    def is_text(self) -> bool:
        """Whether this is a categorical text column."""
        return bool(self.values)


@dataclass(frozen=True)
class Table:
    """One table of a domain.

    Attributes:
        name: SQL table name.
        singular: The entity in questions, singular (``"singer"``).
        plural: The entity in questions, plural (``"singers"``).
        key: Integer primary key column.
        name_col: Unique text column naming each row.
        name_suffix: Word appended to generated names (``" Arena"``), may be empty.
        category: The categorical text column.
        numbers: The integer columns.
        rows: Number of rows to generate.
    """

    name: str
    singular: str
    plural: str
    key: str
    name_col: str
    name_suffix: str
    category: Column
    numbers: tuple[Column, ...]
    rows: int


@dataclass(frozen=True)
class Domain:
    """A database: a parent table and a child table with a foreign key to it.

    Attributes:
        name: Domain name; the database file is ``<name>/<name>.sqlite``.
        seed: Seed of the data generator.
        parent: The referenced table.
        child: The referencing table; its column ``parent.key`` is the foreign key.
    """

    name: str
    seed: int
    parent: Table
    child: Table

    @property
    def db_id(self) -> str:
        """Path of the database file relative to the SQL database root."""
        return f"{self.name}/{self.name}.sqlite"

    @property
    def fk(self) -> str:
        """Name of the child's foreign-key column (the parent's key)."""
        return self.parent.key

    def schema_lines(self) -> list[str]:
        """Compact schema: one ``table(col, ...)`` line per table and one foreign-key line."""
        lines = []
        for table in (self.child, self.parent):
            cols = [table.key, table.name_col, table.category.name]
            cols += [c.name for c in table.numbers]
            if table is self.child:
                cols.append(self.fk)
            lines.append(f"{table.name}({', '.join(cols)})")
        lines.append(f"{self.child.name}.{self.fk} -> {self.parent.name}.{self.parent.key}")
        return lines


def _cat(name: str, nl: str, values: str) -> Column:
    return Column(name, nl, values=tuple(values.split(",")))


def _num(name: str, nl: str, low: int, high: int, unique: bool = False, summable: bool = True) -> Column:
    return Column(name, nl, low=low, high=high, unique=unique, summable=summable)


def _year(name: str, nl: str, low: int, high: int, unique: bool = False) -> Column:
    return _num(name, nl, low, high, unique=unique, summable=False)


def _table(name, singular, plural, name_col, suffix, category, numbers, rows) -> Table:
    return Table(name, singular, plural, f"{name}_id", name_col, suffix, category, tuple(numbers), rows)


#: Domains of the train and in-domain test splits.
TRAIN_DOMAINS: tuple[Domain, ...] = (
    Domain(
        "concerts", 101,
        _table("stadium", "stadium", "stadiums", "stadium_name", " Arena",
               _cat("city", "city", "Paris,Berlin,Madrid,Rome,Vienna"),
               [_num("capacity", "capacity", 5000, 90000, unique=True)], 8),
        _table("singer", "singer", "singers", "singer_name", "",
               _cat("country", "country", "France,Spain,Italy,Japan,Brazil,Canada"),
               [_num("age", "age", 18, 70), _num("sales", "record sales", 10, 990, unique=True)], 36),
    ),
    Domain(
        "library", 102,
        _table("author", "author", "authors", "author_name", "",
               _cat("nationality", "nationality", "British,Irish,Indian,Chilean,Polish"),
               [_year("birth_year", "birth year", 1900, 1999, unique=True)], 8),
        _table("book", "book", "books", "title", " Tales",
               _cat("genre", "genre", "mystery,poetry,history,romance,fantasy,science"),
               [_num("pages", "page count", 80, 900, unique=True), _num("price", "price", 5, 60)], 36),
    ),
    Domain(
        "school", 103,
        _table("department", "department", "departments", "dept_name", " Studies",
               _cat("building", "building", "North,South,East,West,Central"),
               [_num("budget", "budget", 10000, 99000, unique=True)], 8),
        _table("student", "student", "students", "student_name", "",
               _cat("hometown", "hometown", "Leeds,Dublin,Austin,Denver,Oslo,Lima"),
               [_num("age", "age", 17, 30), _num("credits", "credits", 1, 240, unique=True)], 36),
    ),
    Domain(
        "music", 104,
        _table("label", "label", "labels", "label_name", " Records",
               _cat("country", "country", "USA,Sweden,Korea,Mexico,Ghana"),
               [_year("founded", "founding year", 1950, 2020, unique=True)], 8),
        _table("album", "album", "albums", "album_title", "",
               _cat("genre", "genre", "rock,jazz,pop,folk,metal,blues"),
               [_num("sales", "sales", 100, 9900, unique=True), _num("tracks", "track count", 6, 20)], 36),
    ),
    Domain(
        "sports", 105,
        _table("team", "team", "teams", "team_name", " United",
               _cat("city", "city", "Lagos,Tokyo,Porto,Quito,Cairo"),
               [_year("founded", "founding year", 1880, 2010, unique=True)], 8),
        _table("player", "player", "players", "player_name", "",
               _cat("position", "position", "goalkeeper,defender,midfielder,forward,winger"),
               [_num("age", "age", 17, 38), _num("goals", "goals", 0, 300, unique=True)], 36),
    ),
    Domain(
        "hospital", 106,
        _table("hospital", "hospital", "hospitals", "hospital_name", " Clinic",
               _cat("city", "city", "Boston,Seattle,Atlanta,Phoenix,Miami"),
               [_num("beds", "bed count", 50, 900, unique=True)], 8),
        _table("doctor", "doctor", "doctors", "doctor_name", "",
               _cat("specialty", "specialty", "surgery,cardiology,neurology,pediatrics,oncology,radiology"),
               [_num("age", "age", 28, 70), _num("salary", "salary", 50000, 250000, unique=True)], 36),
    ),
)

#: Domains of the cross-domain test split, never used for training or in-domain testing.
CROSS_DOMAINS: tuple[Domain, ...] = (
    Domain(
        "aviation", 201,
        _table("airline", "airline", "airlines", "airline_name", " Air",
               _cat("country", "country", "Chile,Norway,Kenya,Peru,India"),
               [_num("fleet_size", "fleet size", 10, 400, unique=True)], 8),
        _table("pilot", "pilot", "pilots", "pilot_name", "",
               _cat("pilot_rank", "rank", "captain,officer,trainee,instructor,commander"),
               [_num("age", "age", 24, 64),
                _num("flight_hours", "flight hours", 200, 20000, unique=True)], 36),
    ),
    Domain(
        "farming", 202,
        _table("farm", "farm", "farms", "farm_name", " Farm",
               _cat("region", "region", "Alpine,Coastal,Desert,Valley,Prairie"),
               [_num("acres", "acreage", 20, 5000, unique=True)], 8),
        _table("animal", "animal", "animals", "animal_name", "",
               _cat("species", "species", "cow,sheep,goat,horse,pig,llama"),
               [_num("age", "age", 1, 20), _num("weight", "weight", 20, 1200, unique=True)], 36),
    ),
    Domain(
        "museum", 203,
        _table("museum", "museum", "museums", "museum_name", " Gallery",
               _cat("city", "city", "Prague,Athens,Zurich,Lisbon,Warsaw"),
               [_num("visitors", "visitor count", 1000, 99000, unique=True)], 8),
        _table("painting", "painting", "paintings", "painting_title", "",
               _cat("style", "style", "baroque,cubist,abstract,realist,impressionist,gothic"),
               [_year("year", "year", 1400, 2000), _num("price", "price", 100, 9900, unique=True)], 36),
    ),
)

ALL_DOMAINS: tuple[Domain, ...] = TRAIN_DOMAINS + CROSS_DOMAINS


def _names(rng: random.Random, count: int, suffix: str) -> list[str]:
    """``count`` distinct pronounceable names such as ``"Torvel"`` (plus ``suffix``)."""
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < count:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 2, 3)))).capitalize()
        if word not in seen:
            seen.add(word)
            names.append(word + suffix)
    return names


def _number_values(rng: random.Random, column: Column, count: int) -> list[int]:
    if column.unique:
        span = column.high - column.low + 1
        if span < count:
            raise ValueError(
                f"Column {column.name!r} is unique but its range [{column.low}, {column.high}] holds "
                f"only {span} values for {count} rows; widen the range or lower the row count."
            )
        return rng.sample(range(column.low, column.high + 1), count)
    return [rng.randint(column.low, column.high) for _ in range(count)]


def _table_rows(rng: random.Random, table: Table, parent_ids: list[int] | None) -> list[tuple]:
    names = _names(rng, table.rows, table.name_suffix)
    numbers = [_number_values(rng, col, table.rows) for col in table.numbers]
    rows = []
    for i in range(table.rows):
        row = [i + 1, names[i], rng.choice(table.category.values)]
        row += [values[i] for values in numbers]
        if parent_ids is not None:
            row.append(rng.choice(parent_ids))
        rows.append(tuple(row))
    return rows


def build_database(domain: Domain) -> sqlite3.Connection:
    """Create the domain's database in memory, filled with deterministic rows.

    Args:
        domain: The domain to build.

    Returns:
        An open in-memory connection; ``conn.serialize()`` gives the database file's bytes.
    """
    rng = random.Random(domain.seed)
    conn = sqlite3.connect(":memory:")
    parent, child = domain.parent, domain.child
    parent_cols = [f"{parent.key} INTEGER PRIMARY KEY", f"{parent.name_col} TEXT NOT NULL",
                   f"{parent.category.name} TEXT NOT NULL"]
    parent_cols += [f"{c.name} INTEGER NOT NULL" for c in parent.numbers]
    child_cols = [f"{child.key} INTEGER PRIMARY KEY", f"{child.name_col} TEXT NOT NULL",
                  f"{child.category.name} TEXT NOT NULL"]
    child_cols += [f"{c.name} INTEGER NOT NULL" for c in child.numbers]
    child_cols += [f"{domain.fk} INTEGER NOT NULL",
                   f"FOREIGN KEY ({domain.fk}) REFERENCES {parent.name}({parent.key})"]
    conn.execute(f"CREATE TABLE {parent.name} ({', '.join(parent_cols)})")
    conn.execute(f"CREATE TABLE {child.name} ({', '.join(child_cols)})")
    parent_rows = _table_rows(rng, parent, None)
    child_rows = _table_rows(rng, child, [r[0] for r in parent_rows])
    for table, rows in ((parent, parent_rows), (child, child_rows)):
        marks = ", ".join("?" * len(rows[0]))
        conn.executemany(f"INSERT INTO {table.name} VALUES ({marks})", rows)
    conn.commit()
    return conn
