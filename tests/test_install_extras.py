"""Every install command in the repository names extras that setup.py declares, as pip sees them.

setuptools writes an extra's name to the package metadata in its normalized form (PEP 685:
lower case, each run of ``-``, ``_`` and ``.`` one ``-``), and pip before 23.3 compares the name
in ``pip install ".[name]"`` with that metadata as written: asked for ``.[reasoning_gym]`` it
warns that the extra does not exist and installs nothing of it, so the tests that need it skip.
Hence both rules below: the keys of ``extras_require`` are normalized names, and every
``.[...]`` of a ``pip install`` in the README, the docs, CI, the examples, the package and the
tests names one of them exactly.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Where install commands are written for users, for CI or in error messages.
TEXTS = ("README.md", "docs/**/*.md", ".ci/*", "tuned_examples/**/*.py", "rllib_dph/**/*.py", "tests/*.py",
         "research/**/*.py", "bench/**/*.py", "tools/**/*")
#: ``pip install`` ... ``.[a,b]`` on one line (editable or not, quoted or not).
INSTALL = re.compile(r"pip install\b[^\n]*?\.\[([^\]]+)\]")


def normalized(name: str) -> str:
    """PEP 685's form of an extra's name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_extras() -> list[str]:
    """The keys of setup.py's ``extras_require``, read from its source."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            assert isinstance(node.value, ast.Dict), "setup.py: extras_require is not a dict literal"
            return [ast.literal_eval(key) for key in node.value.keys]
    raise AssertionError("setup.py has no extras_require")


def install_commands() -> list[tuple[str, int, list[str]]]:
    """(file, line, extras named) of each ``pip install ".[...]"`` in the repository's texts."""
    found = []
    for pattern in TEXTS:
        for path in sorted(REPO.glob(pattern)):
            if not path.is_file() or path.suffix in {".png", ".whl"} or path == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                for match in INSTALL.finditer(line):
                    found.append((str(path.relative_to(REPO)), number, [e.strip() for e in match.group(1).split(",")]))
    return found


def test_extras_are_declared_under_their_normalized_names():
    for name in declared_extras():
        assert name == normalized(name), (
            f"setup.py: extra {name!r} is not in PEP 685 form; pip < 23.3 would not find it under that "
            f"name. Declare it as {normalized(name)!r} and write .[{normalized(name)}] in install commands"
        )


def test_every_install_command_names_a_declared_extra():
    declared = set(declared_extras())
    commands = install_commands()
    assert len(commands) >= 10, f"found only {len(commands)} install commands; is INSTALL still matching them?"
    wrong = [(f, n, e) for f, n, extras in commands for e in extras if e not in declared]
    assert not wrong, "install commands naming an extra setup.py does not declare as written: " + "; ".join(
        f"{f}:{n}: .[{e}] (declared: {sorted(declared)})" for f, n, e in wrong
    )
