"""Config setters whose fields are the names their docstring documents.

A field of a config takes three sites in its config's file: its default (``__init__``), its
entry in a setter's ``Args:`` section, and its rule (``rules.py``). :func:`setter` turns a
method that holds only the docstring into the setter of the fields that docstring documents:

.. code-block:: python

    @setter
    def held_out(self, given: dict) -> None:
        \"\"\"Sets the pass@k evaluation on a validation split.

        Args:
            val_interval: Evaluate every N training iterations; 0 (default) disables it.
        \"\"\"

``config.held_out(val_interval=5)`` then sets ``config.val_interval = 5`` and returns the
config. The method body may rewrite ``given`` (the documented fields the call gave, by name)
before they are set, e.g. to merge a dict into an embedded setting. A setter that overrides one
of RLlib's (``training``, ``env_runners``, ``learners``) passes every other keyword to RLlib's;
any other keyword is refused naming the field meant (``field_names.check_keywords``).
``inspect.signature`` of a setter lists its fields as keyword-only parameters.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Callable

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided

from rllib_dph.algorithms.field_names import check_keywords

#: An entry of a Google-style ``Args:`` section: its name, at the section's first indentation.
_ENTRY = re.compile(r"(\w+):")


def documented_fields(method: Callable) -> tuple[str, ...]:
    """The names the ``Args:`` section of ``method``'s docstring documents, in order, without
    ``*args``/``**kwargs`` entries.

    Raises:
        ValueError: The docstring has no ``Args:`` section.
    """
    lines = inspect.cleandoc(method.__doc__ or "").splitlines()
    if "Args:" not in lines:
        raise ValueError(f"setter {method.__qualname__} documents no fields: its docstring needs an Args: section")
    names = []
    for line in lines[lines.index("Args:") + 1:]:
        if line.strip() and not line.startswith(" "):  # the next section
            break
        entry = _ENTRY.match(line[4:]) if line.startswith("    ") and not line.startswith("     ") else None
        if entry:
            names.append(entry.group(1))
    return tuple(names)


def setter(method: Callable) -> Callable:
    """The setter of the fields ``method``'s docstring documents (module docstring).

    Documented fields that RLlib's setter of the same name takes (e.g. ``minibatch_size`` in
    ``training``) go to RLlib's setter, as undocumented keywords do.
    """
    rllib_setter = getattr(AlgorithmConfig, method.__name__, None)
    rllib_fields = set(inspect.signature(rllib_setter).parameters) if rllib_setter else set()
    own = [name for name in documented_fields(method) if name not in rllib_fields]

    @functools.wraps(method)
    def set_fields(self, **keywords):
        given = {name: value for name, value in keywords.items() if name in own and value is not NotProvided}
        others = {name: value for name, value in keywords.items() if name not in own}
        if rllib_setter is None:
            check_keywords(self, method.__name__, others)
        else:
            check_keywords(self, method.__name__, others, rllib_setter)
            rllib_setter(self, **others)
        method(self, given)
        for name, value in given.items():
            setattr(self, name, value)
        return self

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=NotProvided) for name in own]
    if rllib_setter is not None:
        parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    set_fields.__signature__ = inspect.Signature(parameters)  # read before the method's (self, given)
    set_fields.fields = tuple(own)
    return set_fields
