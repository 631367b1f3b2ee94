"""Database domains of the synthetic SQL suite and the deterministic generation of their data.

Every domain has two tables: a *parent* table (e.g. ``stadium``) and a *child* table (e.g.
``singer``) whose foreign key points at the parent. Each table has an integer primary key, a
unique name column, one categorical text column and one or two integer columns. Column names are
unique within a domain (except the foreign key, which repeats the parent's key), so a query over a
join can be wrapped in a sub-query or CTE without renaming columns.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
from dataclasses import dataclass
from typing import Iterator

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
    def nulls_db_id(self) -> str:
        """Path of the NULL family's copy of the database (``build_database(..., null_share)``)."""
        return f"{self.name}/{self.name}_nulls.sqlite"

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


#: Hand-written domains of the train and in-domain test splits.
HAND_DOMAINS: tuple[Domain, ...] = (
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

# ---------------------------------------------------------------------------------------------
# Generated training domains
#
# Six hand-written databases let a small model memorise their schemas instead of reading the
# schema lines of the prompt, and then it cannot answer a question on any other database. The
# generated domains below pair entities and columns from word pools at random (seeded), so that
# training covers many schemas and writing a query means copying names from the prompt.
#
# The cross-domain databases are drawn from the same pools: a model of a million parameters
# cannot write a table or column name made of tokens it never saw in training (measured with
# unseen words: docs/models.md, "How the cross-domain split became solvable"), so
# "unseen database" here means an unseen schema — a pairing of tables and a set of columns that
# no training database has — with its own rows.

#: Entities of generated tables: (singular, plural, suffix of generated row names).
_ENTITIES = (
    ("castle", "castles", " Keep"), ("knight", "knights", ""), ("bakery", "bakeries", " Bakes"),
    ("baker", "bakers", ""), ("island", "islands", " Isle"), ("lighthouse", "lighthouses", " Light"),
    ("planet", "planets", ""), ("moon", "moons", ""), ("orchestra", "orchestras", " Ensemble"),
    ("musician", "musicians", ""), ("theater", "theaters", " Stage"), ("actor", "actors", ""),
    ("garden", "gardens", " Garden"), ("flower", "flowers", ""), ("river", "rivers", " River"),
    ("bridge", "bridges", " Bridge"), ("village", "villages", ""), ("villager", "villagers", ""),
    ("station", "stations", " Station"), ("train", "trains", " Express"), ("harbor", "harbors", " Port"),
    ("boat", "boats", ""), ("studio", "studios", " Studios"), ("film", "films", ""),
    ("kingdom", "kingdoms", ""), ("wizard", "wizards", ""), ("factory", "factories", " Works"),
    ("robot", "robots", ""), ("hotel", "hotels", " Hotel"), ("guest", "guests", ""),
    ("bank", "banks", " Bank"), ("client", "clients", ""), ("company", "companies", " Corp"),
    ("employee", "employees", ""), ("shop", "shops", " Shop"), ("product", "products", ""),
    ("club", "clubs", " Club"), ("member", "members", ""), ("park", "parks", " Park"),
    ("tree", "trees", ""), ("mine", "mines", " Mine"), ("miner", "miners", ""),
)
#: Categorical columns of generated tables: (column, question words, values).
_CATEGORIES = (
    ("color", "color", "red,blue,green,amber,violet"),
    ("material", "material", "stone,wood,glass,steel,clay"),
    ("climate", "climate", "humid,arid,polar,temperate,tropical"),
    ("shape", "shape", "round,square,oval,flat,spiral"),
    ("mood", "mood", "calm,bright,dark,lively,gentle"),
    ("grade", "grade", "gold,silver,bronze,iron,tin"),
    ("district", "district", "Harbor,Uptown,Riverside,Market,Hillside"),
    ("language", "language", "Latin,Greek,Hindi,Welsh,Swahili"),
    ("season", "season", "spring,summer,autumn,winter"),
    ("owner", "owner", "state,church,family,guild,crown"),
    ("flavor", "flavor", "sweet,sour,salty,bitter,spicy"),
    ("status", "status", "active,retired,pending,closed,open"),
)
#: Integer columns of generated tables: (column, question words, low, high, summable).
_NUMBERS = (
    ("height", "height", 10, 990, True), ("length", "length", 100, 9900, True),
    ("rating", "rating", 1, 500, True), ("stock", "stock", 0, 9000, True),
    ("speed", "top speed", 20, 900, True), ("depth", "depth", 5, 800, True),
    ("score", "score", 0, 1000, True), ("income", "income", 1000, 99000, True),
    ("width", "width", 10, 700, True), ("distance", "distance", 50, 5000, True),
    ("power", "power", 1, 600, True), ("volume", "volume", 100, 8000, True),
    ("built", "construction year", 1000, 2020, False), ("opened", "opening year", 1800, 2020, False),
)


def _generated_table(rng: random.Random, entity: tuple[str, str, str], categories: list, numbers: list,
                     count: int, rows: int) -> Table:
    """A table of ``entity`` with one category and ``count`` integer columns (the first unique)."""
    singular, plural, suffix = entity
    name, nl, values = categories.pop()
    columns = []
    for i in range(count):
        col, col_nl, low, high, summable = numbers.pop()
        columns.append(_num(col, col_nl, low, high, unique=i == 0, summable=summable))
    rng.shuffle(columns)
    return _table(singular, singular, plural, f"{singular}_name", suffix, _cat(name, nl, values), columns, rows)


def _draw_domains(seed: int) -> Iterator[Domain]:
    """Endless seeded draws: domain ``i`` pairs two distinct entities with columns from the pools."""
    rng = random.Random(seed)
    for i in itertools.count():
        parent, child = rng.sample(_ENTITIES, 2)
        categories = rng.sample(_CATEGORIES, 2)
        numbers = rng.sample(_NUMBERS, 3)
        yield Domain(
            f"gen_{i:02d}", seed + i,
            _generated_table(rng, parent, categories, numbers, 1, 8),
            _generated_table(rng, child, categories, numbers, 2, 36),
        )


def generated_domains(count: int, seed: int) -> tuple[Domain, ...]:
    """The first ``count`` domains drawn with ``seed``, each with columns from the word pools.

    Args:
        count: Number of domains.
        seed: Seed of the draw; domain ``i``'s data generator is seeded ``seed + i``.

    Returns:
        Domains named ``gen_00``, ``gen_01``, ...
    """
    return tuple(itertools.islice(_draw_domains(seed), count))


def _table_schemas(domain: Domain) -> set:
    """Each table of a domain as (name, set of its non-key columns)."""
    tables = (domain.parent, domain.child)
    return {(t.name, frozenset([t.category.name, *(c.name for c in t.numbers)])) for t in tables}


def unseen_domains(count: int, seed: int, seen: tuple[Domain, ...], prefix: str) -> tuple[Domain, ...]:
    """``count`` drawn domains that share no table pair and no table schema with ``seen``.

    Drawn as :func:`generated_domains` does, skipping candidates whose parent/child pair (either
    way round) is in ``seen`` or was kept already, or whose parent or child table (name and
    columns) appears in ``seen``.
    """
    pairs = {frozenset((d.parent.name, d.child.name)) for d in seen}
    tables = set().union(*(_table_schemas(d) for d in seen))
    kept: list[Domain] = []
    for candidate in itertools.islice(_draw_domains(seed), len(_ENTITIES) ** 2):
        pair = frozenset((candidate.parent.name, candidate.child.name))
        if pair in pairs or _table_schemas(candidate) & tables:
            continue
        pairs.add(pair)
        kept.append(Domain(f"{prefix}_{len(kept):02d}", candidate.seed, candidate.parent, candidate.child))
        if len(kept) == count:
            return tuple(kept)
    raise ValueError(f"only {len(kept)} of {count} unseen domains could be drawn from the word pools")


#: Generated domains of the train and in-domain test splits.
GENERATED_DOMAINS: tuple[Domain, ...] = generated_domains(30, seed=300)
#: Every domain of the train and in-domain test splits.
TRAIN_DOMAINS: tuple[Domain, ...] = HAND_DOMAINS + GENERATED_DOMAINS
#: Domains of the cross-domain test split: schemas that no training database has.
CROSS_DOMAINS: tuple[Domain, ...] = unseen_domains(3, seed=900, seen=TRAIN_DOMAINS, prefix="cross")
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


def build_database(domain: Domain, null_share: float = 0.0) -> sqlite3.Connection:
    """Create the domain's database in memory, filled with deterministic rows.

    Args:
        domain: The domain to build.
        null_share: Share of the integer columns' values set to NULL, each drawn independently
            from a generator of its own (the NULL family's databases, ``sql_suite.NULL_SHARE``);
            with 0 the integer columns are ``NOT NULL`` and the file is the domain's own. The
            other values are the same either way.

    Returns:
        An open in-memory connection; ``conn.serialize()`` gives the database file's bytes.
    """
    rng = random.Random(domain.seed)
    conn = sqlite3.connect(":memory:")
    parent, child = domain.parent, domain.child
    number = "INTEGER" if null_share else "INTEGER NOT NULL"
    parent_cols = [f"{parent.key} INTEGER PRIMARY KEY", f"{parent.name_col} TEXT NOT NULL",
                   f"{parent.category.name} TEXT NOT NULL"]
    parent_cols += [f"{c.name} {number}" for c in parent.numbers]
    child_cols = [f"{child.key} INTEGER PRIMARY KEY", f"{child.name_col} TEXT NOT NULL",
                  f"{child.category.name} TEXT NOT NULL"]
    child_cols += [f"{c.name} {number}" for c in child.numbers]
    child_cols += [f"{domain.fk} INTEGER NOT NULL",
                   f"FOREIGN KEY ({domain.fk}) REFERENCES {parent.name}({parent.key})"]
    conn.execute(f"CREATE TABLE {parent.name} ({', '.join(parent_cols)})")
    conn.execute(f"CREATE TABLE {child.name} ({', '.join(child_cols)})")
    parent_rows = _table_rows(rng, parent, None)
    child_rows = _table_rows(rng, child, [r[0] for r in parent_rows])
    nulls = random.Random(f"{domain.seed}/nulls")
    for table, rows in ((parent, parent_rows), (child, child_rows)):
        if null_share:
            rows = [_with_nulls(nulls, row, len(table.numbers), null_share) for row in rows]
        marks = ", ".join("?" * len(rows[0]))
        conn.executemany(f"INSERT INTO {table.name} VALUES ({marks})", rows)
    conn.commit()
    return conn


def _with_nulls(rng: random.Random, row: tuple, numbers: int, share: float) -> tuple:
    """``row`` with each of its integer columns (positions 3 .. 3 + numbers) NULL with probability ``share``."""
    values = list(row)
    for i in range(3, 3 + numbers):
        if rng.random() < share:
            values[i] = None
    return tuple(values)
