"""docs/reference/config.md covers every config field, from the setters' own docstrings.

The page renders the Args of the setters it names (mkdocstrings), so a field is in the reference
exactly when a setter the page renders documents it. These tests fail when a field is added to
``GRPOConfig`` or ``DPHConfig`` without a line in a rendered setter's docstring, when the page
stops rendering a setter, or when its table of RLlib fields with other defaults goes stale.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "config.md"


def rendered_setters() -> dict[str, list[str]]:
    """``{"GRPOConfig": ["llm", ...], "DPHConfig": ["dph"]}``: the methods the page renders."""
    found: dict[str, list[str]] = {}
    for cls, method in re.findall(r"^::: rllib_dph\.algorithms\.\w+\.\w+\.(\w+)\.(\w+)$", PAGE.read_text(), re.M):
        found.setdefault(cls, []).append(method)
    return found


def documented_fields() -> set[str]:
    """Every name documented as an argument (``name:`` in Args) of a rendered setter."""
    from rllib_dph import DPHConfig, GRPOConfig

    classes = {"GRPOConfig": GRPOConfig, "DPHConfig": DPHConfig}
    names: set[str] = set()
    for cls, methods in rendered_setters().items():
        for method in methods:
            doc = inspect.getdoc(getattr(classes[cls], method))
            args = doc[doc.index("Args:"):]
            names |= set(re.findall(r"^    (\w+):", args, re.M))
    return names


def test_the_page_renders_every_setter_that_documents_fields():
    assert rendered_setters() == {
        "GRPOConfig": ["llm", "training", "env_runners", "learners", "held_out"],
        "DPHConfig": ["dph"],
    }


def test_every_field_of_the_configs_is_documented_in_a_rendered_setter():
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from rllib_dph import DPHConfig

    ours = {name for name in vars(DPHConfig()) if not name.startswith("_")} - set(vars(AlgorithmConfig()))
    assert ours, "no fields found: the test reads the wrong config"
    missing = sorted(ours - documented_fields())
    assert not missing, f"fields without a line in a setter's Args (so not in docs/reference/config.md): {missing}"


def test_the_table_of_rllib_fields_with_other_defaults_is_the_config():
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from rllib_dph import GRPOConfig

    ours, rllib = GRPOConfig(), AlgorithmConfig()
    rows = re.findall(r"^\| `(\w+)` \| `\w+\(\)` \| `([^`]+)`[^|]* \| `([^`]+)` \|$", PAGE.read_text(), re.M)
    assert rows, "the table of RLlib fields with other defaults is missing"
    for name, here, theirs in rows:
        assert repr(getattr(ours, name)) == here, f"{name}: the page says {here}, GRPOConfig has {getattr(ours, name)!r}"
        assert repr(getattr(rllib, name)) == theirs, f"{name}: the page says RLlib's is {theirs}"
    differing = {
        name for name in vars(rllib)
        if not name.startswith("_") and name not in WIRING and getattr(ours, name) != getattr(rllib, name)
    }
    assert {name for name, _, _ in rows} == differing


#: RLlib fields GRPOConfig sets as wiring, not as settings a user tunes: its algorithm and env
#: runner classes, the env runner connector states it neither merges nor broadcasts (there are none),
#: and RLlib's per-tensor NaN check that the learner's own skip of non-finite steps replaces.
WIRING = {"algo_class", "env_runner_cls", "broadcast_env_runner_states", "merge_env_runner_states",
          "torch_skip_nan_gradients"}
