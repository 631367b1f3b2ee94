"""The README's Python example runs as written, on the shipped tiny model.

The test takes the README's one ```python block and runs it in a fresh interpreter in an empty
folder, with two changes of size only, so that it takes seconds rather than a minute: 2 training
iterations instead of the README's 10 and 4 evaluation prompts instead of 20. Each change must
find its text, so a README whose example changes shape fails here until this test follows it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: (text in the README's example, what the test runs instead): sizes only.
SMALLER = (("range(10)", "range(2)"), ("limit=20", "limit=4"))


def readme_example() -> str:
    """The code of the README's one ```python block."""
    blocks = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(encoding="utf-8"), re.M | re.S)
    assert len(blocks) == 1, f"README.md has {len(blocks)} ```python blocks; this test runs exactly one"
    return blocks[0]


def test_the_example_is_at_most_20_lines():
    assert len(readme_example().strip().splitlines()) <= 20


def test_the_readme_python_example_trains_saves_and_evaluates(tmp_path: Path):
    code = readme_example()
    for old, new in SMALLER:
        assert code.count(old) == 1, f"the README's example no longer holds {old!r} once; update SMALLER"
        code = code.replace(old, new)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.strip().splitlines()
    iterations = [line.split() for line in lines if re.fullmatch(r"\d+ [0-9.]+", line)]
    assert [int(fields[0]) for fields in iterations] == [1, 2], out.stdout
    assert all(0.0 <= float(fields[1]) <= 1.0 for fields in iterations)
    pass_at_1, pass_at_16 = map(float, lines[-1].split())
    assert 0.0 <= pass_at_1 <= pass_at_16 <= 1.0, lines[-1]
    assert (tmp_path / "grpo_sql_checkpoint" / "rllib_checkpoint.json").is_file()
