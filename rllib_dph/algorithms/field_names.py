"""The "did you mean" of a config field name that is not one.

A name that is no field of the config, given as a ``--config`` key (``rllib train``, a tuned
example run as a script) or as a keyword of a setter (``.training(...)``, ``.dph(...)``,
``.llm(...)``, ...), is refused with the field the user most likely meant: the field that the
DPH-RL paper or another RLVR library names that way (:data:`FIELD_ALIASES`), else the field
closest in spelling (:func:`close_match`); for a setter keyword also the setter that
takes the field.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any, Callable, Iterable, Optional

#: Names of a setting in the DPH-RL paper or in other RLVR libraries → (the field here, where
#: the name comes from). Only renames of the same setting; a name that means something else
#: here is not listed.
FIELD_ALIASES: dict[str, tuple[str, str]] = {
    "eta": ("pef_coeff", "η, the weight of the D_pef term in the paper's Eq. 7"),
    "pef_weight": ("pef_coeff", "η, the weight of the D_pef term"),
    "beta": ("kl_coeff", "β of the KL penalty to the reference model, as in TRL's GRPOConfig"),
    "kl_loss_coef": ("kl_coeff", "verl's KL loss weight"),
    "num_generations": ("group_size", "TRL's completions per prompt"),
    "max_completion_length": ("max_response_length", "TRL's limit of generated tokens"),
    "learning_rate": ("lr", "RLlib's name of the learning rate"),
    "model": ("model_name", "the policy's name or path; RLlib's own `model` field is its legacy model settings"),
    "clip_ratio_low": ("trust_region", "verl's ε_low: trust_region={'kind': 'ppo', 'low': ...}"),
    "clip_ratio_high": ("trust_region", "verl's ε_high: trust_region={'kind': 'ppo', 'high': ...}"),
    "epsilon": ("trust_region", "TRL's ε: trust_region={'kind': 'ppo', 'low': ..., 'high': ...}"),
    "epsilon_high": ("trust_region", "TRL's ε_high: trust_region={'kind': 'ppo', 'high': ...}"),
}


def fields(config: Any) -> set[str]:
    """The public fields of ``config`` (an ``AlgorithmConfig``)."""
    return {name for name in vars(config) if not name.startswith("_")}


def close_match(word: str, choices: Iterable[str]) -> Optional[str]:
    """The closest of ``choices`` to ``word`` in spelling (``difflib``, ratio >= 0.6), or None."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def meant_field(config: Any, name: str) -> tuple[Optional[str], str]:
    """The field of ``config`` that ``name`` most likely means, and why (``""`` for a spelling
    match); ``(None, "")`` when no field comes close."""
    known = fields(config)
    if name in FIELD_ALIASES and FIELD_ALIASES[name][0] in known:
        return FIELD_ALIASES[name]
    return close_match(name, sorted(known)), ""


def field_suggestion(config: Any, name: str, *, setter: bool = False) -> str:
    """`` (did you mean 'pef_coeff'? ...)`` for the unknown field ``name`` of ``config``, or ``""``.

    Args:
        setter: The name was a setter keyword: the suggestion names the setter that takes the
            field (``.dph(pef_coeff=...)``).
    """
    field, why = meant_field(config, name)
    if field is None:
        return ""
    where = setter_of(type(config), field) if setter else None
    if field == name:  # a field of another setter
        return f" ({name!r} is set with .{where}({name}=...))" if where else ""
    notes = [why] if why else []
    if where is not None:
        notes.append(f"set it with .{where}({field}=...)")
    return f" (did you mean {field!r}?{' ' + '; '.join(notes) if notes else ''})"


@functools.lru_cache(maxsize=None)
def setter_of(config_class: type, field: str) -> Optional[str]:
    """The public method of ``config_class`` with a keyword parameter named ``field`` (the
    class's own setters before RLlib's), or None."""
    for cls in config_class.__mro__:
        for name, member in vars(cls).items():
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            parameter = inspect.signature(member).parameters.get(field)
            if parameter is not None and parameter.kind == inspect.Parameter.KEYWORD_ONLY:
                return name
    return None


def check_keywords(config: Any, setter: str, names: Iterable[str], *accepted_by: Callable) -> None:
    """Refuses keywords of ``config.<setter>(...)`` that none of ``accepted_by`` takes.

    Args:
        setter: The setter's name, as the message shows it.
        names: The keywords given beyond the setter's own parameters.
        accepted_by: The functions the setter passes those keywords on to (e.g. RLlib's
            ``AlgorithmConfig.training``); none: it takes no more keywords.

    Raises:
        TypeError: Naming the first unknown keyword and the field it most likely means.
    """
    accepted = {name for fn in accepted_by for name in inspect.signature(fn).parameters}
    for name in names:
        if name not in accepted:
            raise TypeError(
                f"{type(config).__name__}.{setter}() got an unexpected keyword argument {name!r}"
                f"{field_suggestion(config, name, setter=True)}."
            )
