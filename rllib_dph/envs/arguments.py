"""Validation of the numeric arguments of the verifiers (timeouts, penalties, pool bounds).

A verifier must never score a correct answer 0 because of its own settings, and its helper
threads (the SQL watchdog, the math checker service) must never die of an argument: a timeout
of ``inf`` or ``1e300`` overflows ``threading``'s waits, ``nan`` compares false with everything,
and ``1e-9`` times out every query. So every numeric argument is checked where it enters (the
public function or the env constructor) against a documented range, and a bad one is a caller
error raised at once (:class:`ArgumentError`), naming the value, the rule and the fix. It is
never turned into a reward: ``rllib_dph.envs.registry.FunctionVerifierEnv`` lets it through where it
scores any other exception of a verifier 0.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

#: Range of a verifier timeout in seconds (SQL wall clock, math CPU time): shorter cannot run a
#: query or a check at all; longer is no timeout for RL scoring (and 1e10 s would overflow the
#: waits of ``threading``).
MIN_TIMEOUT_S = 0.01
MAX_TIMEOUT_S = 3600.0


class ArgumentError(ValueError, TypeError):
    """A verifier argument out of its rule (a caller error, never scored). A ValueError, and a
    TypeError too, so that callers catching either for a bad argument keep working."""


def check_real(
    value: Any, name: str, *, low: float, high: float, where: str, default: Any
) -> float:
    """Returns ``value`` as a float when it is a finite real number in ``[low, high]``.

    Args:
        value: The argument as given.
        name: Its name, e.g. ``"timeout_s"``.
        low, high: The inclusive range.
        where: The function or class it was given to, e.g. ``"verify_sql"``.
        default: Its default, named in the message as a fix.

    Raises:
        ArgumentError: ``value`` is not a real number (a bool, a string, None), or it is NaN,
            infinite or outside ``[low, high]``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(
            f"{where}: {name}={value!r} is a {type(value).__name__}; it must be a real number in "
            f"[{low:g}, {high:g}]; pass e.g. {name}={default!r} (the default)."
        )
    number = float(value)
    if not (math.isfinite(number) and low <= number <= high):
        raise ArgumentError(
            f"{where}: {name}={value!r} is outside [{low:g}, {high:g}] (NaN and infinity "
            f"included); pass a finite number in that range, e.g. {name}={default!r} (the "
            "default)."
        )
    return number


def check_timeout(value: Any, *, where: str, default: float, name: str = "timeout_s") -> float:
    """Returns a verifier timeout in seconds as a float, checked to be within
    [MIN_TIMEOUT_S, MAX_TIMEOUT_S] (see :func:`check_real` for the errors)."""
    return check_real(value, name, low=MIN_TIMEOUT_S, high=MAX_TIMEOUT_S, where=where,
                      default=default)
