"""Math answers: extraction, equivalence with Math-Verify, and the math env ``rllib_dph/Math-v0``.

The answer of a completion is the content of its **last** complete ``\\boxed{...}`` (or
``\\fbox{...}``; braces balanced, ``\\{`` and ``\\}`` are not braces); when there is none, the text
after the last "the answer is" on its line. Two answers are equal when

1. both are plain numbers (``-3``, ``0.75``, ``3/4``, ``\\frac{3}{4}``) with equal values, or they
   are the same string after removing spacing commands (fast path, no Math-Verify call), or
2. Math-Verify's ``parse`` + ``verify`` says so (fractions, decimals, percentages, radicals, tuples,
   sets, LaTeX variants). Two *exact* plain numbers (no decimal point) that differ are unequal
   without asking Math-Verify.

Math-Verify's own timeout uses ``signal.alarm``, which only works in the main thread. We switch it
off and run ``parse`` + ``verify`` in a *checker subprocess* instead (``python -m envs.math``): one
per concurrently calling thread, started lazily, reused across calls (a pipe round trip, ~0.2 ms),
and terminated at exit. Inside it, an interval timer interrupts a check at ``timeout_s`` (the way
Math-Verify does it, but in the checker's main thread); a check stuck in C code (``9^{9^{9^9}}``
computes a huge integer) cannot be interrupted, so the caller kills the checker
``CHECKER_KILL_GRACE_S`` later and starts a replacement at once. A call that arrives while that
replacement is still starting (~0.7 s, see :func:`start_checker`) waits for it. So a check never
hangs, from any thread or Ray actor, whatever the input (huge exponents, deep nesting, malformed
LaTeX). The checker caps its memory, and exits by itself should its parent die mid-check.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from fractions import Fraction
from typing import Any, Mapping, Sequence

from envs.base import Task, Verdict, VerifierEnv
from envs.data import load_tasks

logger = logging.getLogger(__name__)

#: Longest time a checker subprocess may take to start (import Math-Verify); not in ``timeout_s``.
CHECKER_START_LIMIT_S = 120.0
#: A checker that has not answered this long after ``timeout_s`` is stuck in C code: killed.
CHECKER_KILL_GRACE_S = 0.5
#: Address-space cap of a checker subprocess (pathological inputs could otherwise eat all memory).
CHECKER_MEMORY_BYTES = 1 << 30
#: CPU seconds beyond ``timeout_s`` after which a checker is killed by the kernel (when orphaned).
CHECKER_CPU_GRACE_S = 5

_BOX_OPENING = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped char (skipped) or a brace
_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?[ \t]*([^\n]+)", re.IGNORECASE)
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\{(\d+)\}\{(\d+)\}")
_SPACING = re.compile(r"\s+|\\[,;:! ]|\\left|\\right")


def extract_boxed(text: str) -> str | None:
    """Returns the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``, else None.

    One pass over the braces of ``text`` (linear time, whatever the nesting).
    """
    openings = {m.end() - 1 for m in _BOX_OPENING.finditer(text)}  # positions of their "{"
    if not openings:
        return None
    stack: list[int] = []
    last: tuple[int, int] | None = None
    for token in _BRACE_TOKENS.finditer(text):
        if token.group() == "{":
            stack.append(token.start())
        elif token.group() == "}" and stack:
            start = stack.pop()
            if start in openings and (last is None or start > last[0]):
                last = (start, token.start())
    return None if last is None else text[last[0] + 1 : last[1]].strip()


def extract_answer(completion: str) -> str | None:
    """The final answer: the last ``\\boxed{}``, else the last "the answer is X", else None."""
    boxed = extract_boxed(completion)
    if boxed is not None:
        return boxed
    matches = _ANSWER_IS.findall(completion)
    if not matches:
        return None
    answer = matches[-1].strip().strip("*").strip().rstrip(".").strip().strip("$").strip()
    return answer or None


def _gold_text(gold_answer: Any) -> str:
    """The gold answer as a string; a boxed gold is unboxed and surrounding ``$`` removed."""
    if isinstance(gold_answer, (int, float, Fraction)) and not isinstance(gold_answer, bool):
        return str(gold_answer)
    text = str(gold_answer).strip()
    boxed = extract_boxed(text)
    return (boxed if boxed is not None else text).strip().strip("$").strip()


def _as_fraction(answer: str) -> Fraction | None:
    """The value of a plain number (``-3``, ``0.75``, ``3/4``, ``\\frac{3}{4}``), else None."""
    latex = _LATEX_FRACTION.fullmatch(answer)
    if latex is not None:
        answer = f"{latex.group(1)}{latex.group(2)}/{latex.group(3)}"
    elif _PLAIN_NUMBER.fullmatch(answer) is None:
        return None
    try:
        return Fraction(answer)
    except (ValueError, ZeroDivisionError):
        return None


def _squash(answer: str) -> str:
    """The answer without spacing, ``\\left`` / ``\\right``, and with ``\\dfrac`` as ``\\frac``."""
    return _SPACING.sub("", answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def _fast_equal(gold: str, pred: str) -> bool | None:
    """Decides the easy cases without Math-Verify; None when Math-Verify must decide."""
    g, p = _as_fraction(gold), _as_fraction(pred)
    if g is not None and p is not None:
        if g == p:
            return True
        if "." not in gold and "." not in pred:
            return False  # two different exact numbers (Math-Verify would round decimals)
        return None
    if _squash(gold) == _squash(pred):
        return True
    return None


class _CheckerTimeout(Exception):
    pass


class _CheckerDied(Exception):
    pass


class _Checker:
    """One checker subprocess (``python -m envs.math``) and the JSON-lines protocol to it.

    Request: ``{"gold": str, "pred": str, "limit_s": float}``; reply: ``{"equal": bool,
    "error": str | null}``. The subprocess first writes ``{"ready": true}`` once it has imported
    Math-Verify.
    """

    def __init__(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envs.math"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
        )
        self.ready = False
        self._pending = b""

    def _read_message(self, deadline: float) -> dict | None:
        """Reads one JSON line; None when ``deadline`` passes first."""
        fd = self.proc.stdout.fileno()
        poller = select.poll()  # not select.select: that fails on fd numbers >= 1024
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _CheckerDied(f"exit code {self.proc.poll()}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def wait_ready(self) -> None:
        if self.ready:
            return
        if self._read_message(time.monotonic() + CHECKER_START_LIMIT_S) is None:
            raise _CheckerDied(f"did not start within {CHECKER_START_LIMIT_S:g} s")
        self.ready = True

    def check(self, gold: str, pred: str, timeout_s: float) -> tuple[bool, str | None]:
        """Asks Math-Verify if ``pred`` equals ``gold``; raises _CheckerTimeout or _CheckerDied."""
        self.wait_ready()
        request = json.dumps({"gold": gold, "pred": pred, "limit_s": timeout_s}) + "\n"
        try:
            self.proc.stdin.write(request.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise _CheckerDied(f"cannot send the request ({e})") from e
        reply = self._read_message(time.monotonic() + timeout_s + CHECKER_KILL_GRACE_S)
        if reply is None:
            raise _CheckerTimeout()
        return bool(reply["equal"]), reply["error"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class _CheckerPool:
    """The checker subprocesses of this process: one per concurrently checking thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Checker] = []
        self._live: set[_Checker] = set()
        self._parents_checkers: list[_Checker] = []  # see forget()

    def _spawn(self) -> _Checker:
        checker = _Checker()
        with self._lock:
            self._live.add(checker)
        return checker

    def _acquire(self) -> _Checker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._spawn()

    def _retire(self, checker: _Checker) -> None:
        checker.kill()
        with self._lock:
            self._live.discard(checker)

    def check(self, gold: str, pred: str, timeout_s: float) -> tuple[bool, str | None]:
        """Checks one pair in a checker subprocess, replacing the checker on timeout or crash."""
        checker = self._acquire()
        try:
            result = checker.check(gold, pred, timeout_s)
        except _CheckerTimeout:
            self._retire(checker)
            self._release(self._spawn())  # the replacement starts while the caller goes on
            return False, f"math check timed out after {timeout_s:g} s"
        except _CheckerDied as e:
            self._retire(checker)
            return False, f"math checker process died ({e})"
        except BaseException:
            self._retire(checker)  # e.g. KeyboardInterrupt mid-request: the pipe state is unknown
            raise
        self._release(checker)
        return result

    def warm_up(self) -> None:
        """Makes sure one started checker is idle in the pool."""
        checker = self._acquire()
        try:
            checker.wait_ready()
        except _CheckerDied:
            self._retire(checker)
            raise
        self._release(checker)

    def _release(self, checker: _Checker) -> None:
        with self._lock:
            self._idle.append(checker)

    def close(self) -> None:
        """Kills every checker subprocess (registered with ``atexit``)."""
        with self._lock:
            live, self._live, self._idle = list(self._live), set(), []
        for checker in live:
            checker.kill()

    def forget(self) -> None:
        """In a forked child: let go of the parent's checkers and start with none.

        Our copies of their pipes are closed so that they still see end-of-input when the parent
        exits; the Popen objects are kept (not our processes to wait for or warn about).
        """
        for checker in self._live:
            for stream in (checker.proc.stdin, checker.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        self._parents_checkers = list(self._live)
        self._lock = threading.Lock()
        self._idle, self._live = [], set()


_POOL = _CheckerPool()
atexit.register(_POOL.close)
os.register_at_fork(after_in_child=_POOL.forget)


def start_checker() -> None:
    """Starts a checker subprocess now and waits until it is ready (about 0.7 s).

    Optional: the first check that needs Math-Verify does it otherwise (not counted in its
    ``timeout_s``). Useful before timing checks, or to pay the start-up before training starts.

    Raises:
        RuntimeError: The checker could not start (e.g. ``math-verify`` is not installed).
    """
    try:
        _POOL.warm_up()
    except _CheckerDied as e:
        raise RuntimeError(f"the math checker subprocess did not start: {e}") from e


def verify_math(completion: str, gold_answer: Any, *, timeout_s: float = 5.0) -> Verdict:
    """Checks the final answer of a completion against the gold answer. Never raises.

    Args:
        completion: The model's full answer text.
        gold_answer: The gold answer (LaTeX or plain text; a number is accepted; a ``\\boxed{}``
            gold is unboxed).
        timeout_s: Longest time Math-Verify may spend on this pair, > 0. A check that runs longer
            is abandoned (reward 0, ``error`` says so). The one-off start of the checker
            subprocess (about half a second) is not counted.

    Returns:
        ``Verdict(1.0, True)`` when the answers are equivalent, else reward 0.0 with ``error`` set
        when no answer was found or the check failed.
    """
    try:
        if not isinstance(completion, str):
            return Verdict(0.0, False, f"completion is a {type(completion).__name__}, not a str")
        gold = _gold_text(gold_answer)
        if not gold:
            return Verdict(0.0, False, "the gold answer is empty")
        pred = extract_answer(completion)
        if pred is None:
            return Verdict(0.0, False, "no answer found: no \\boxed{...} and no 'the answer is'")
        equal = _fast_equal(gold, pred)
        error = None
        if equal is None:
            equal, error = _POOL.check(gold, pred, timeout_s)
        return Verdict(1.0 if equal else 0.0, equal, error)
    except Exception as e:  # the training loop must never see a verifier exception
        logger.warning("verify_math failed", exc_info=True)
        return Verdict(0.0, False, f"math check failed: {type(e).__name__}: {e}")


def math_reward(completion: str, gold_answer: Any, *, timeout_s: float = 5.0) -> float:
    """1.0 when the completion's final answer equals ``gold_answer``, else 0.0.

    See :func:`verify_math` for the arguments and the rules.
    """
    return verify_math(completion, gold_answer, timeout_s=timeout_s).reward


class MathEnv(VerifierEnv):
    """Math word problems with a verifiable final answer (``rllib_dph/Math-v0``).

    ## Description
    Each episode is one problem; the model answers with its reasoning and puts the final answer in
    ``\\boxed{}``. The answer is checked against the gold answer with Math-Verify.

    ## Action Space
    ``spaces.Text`` over printable characters: the model's complete answer.

    ## Observation Space
    ``spaces.Text``: the prompt text (chat message contents joined by blank lines).

    ## Rewards
    1.0 when the last ``\\boxed{}`` (fallback: "the answer is X") equals the gold answer, else 0.0.

    ## Starting State
    A problem drawn uniformly with ``self.np_random``, or the one given by ``options={"index": i}``.

    ## Episode End
    Always terminated after one step; never truncated.

    ## Info
    ``task_id``, ``data_source``, ``index``, ``messages``; after ``step`` also ``correct`` and, when
    no answer was found or the check failed or timed out, ``error``.

    ## Arguments
    ``data``: a bundled split name (default ``"math_synth/train"``), a ``.parquet`` / ``.jsonl``
    file in the verl layout (answer in ``reward_model.ground_truth``), or a list of tasks / rows.
    ``timeout_s``: time limit of one answer check in seconds.
    """

    def __init__(
        self,
        data: str | os.PathLike | Sequence[Task | Mapping[str, Any]] = "math_synth/train",
        *,
        timeout_s: float = 5.0,
    ):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be > 0 seconds; the default is 5.0.")
        self.timeout_s = float(timeout_s)
        super().__init__(load_tasks(data, task="math"), self._verify, name="rllib_dph/Math-v0")

    @classmethod
    def from_tasks(cls, tasks: Sequence[Task], **kwargs) -> "MathEnv":
        """Builds the env on already-loaded tasks (``ground_truth`` = the gold answer)."""
        return cls(list(tasks), **kwargs)

    def _verify(self, completion: str, task: Task) -> Verdict:
        return verify_math(completion, task.ground_truth, timeout_s=self.timeout_s)


class _Interrupted(BaseException):
    """Raised in the checker by its interval timer; a BaseException so that Math-Verify's and
    SymPy's ``except Exception`` clauses let it through (like Math-Verify's own timeout)."""


def _interrupt(signum, frame):
    raise _Interrupted()


def _serve() -> None:
    """The checker subprocess: answers JSON-line requests on stdin until stdin closes."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHECKER_MEMORY_BYTES, CHECKER_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file when the CPU limit hits
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # our timeout replaces theirs
    from math_verify import parse, verify

    gold_cache: dict[str, list] = {}

    def parsed(text: str) -> list:
        return parse("\\boxed{" + text + "}", parsing_timeout=None)

    def check(gold_text: str, pred_text: str) -> dict:
        gold = gold_cache.get(gold_text)
        if gold is None:
            gold = gold_cache[gold_text] = parsed(gold_text)
            if len(gold_cache) > 4096:
                gold_cache.pop(next(iter(gold_cache)))
        if not gold:
            return {"equal": False, "error": "Math-Verify cannot parse the gold answer"}
        pred = parsed(pred_text)
        if not pred:
            return {"equal": False, "error": "Math-Verify cannot parse the answer"}
        return {"equal": bool(verify(gold, pred, timeout_seconds=None)), "error": None}

    check("\\frac{1}{2}", "0.5")  # loads the LaTeX grammar before the first timed check
    signal.signal(signal.SIGALRM, _interrupt)
    replies = os.fdopen(os.dup(1), "w")  # the protocol's own handle on stdout;
    os.dup2(2, 1)  # stray prints of libraries go to stderr instead
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        limit_s = request["limit_s"]
        # An orphaned checker stuck in C code is ended by the kernel (SIGXCPU).
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_limit = math.ceil(usage.ru_utime + usage.ru_stime + limit_s) + CHECKER_CPU_GRACE_S
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, resource.RLIM_INFINITY))
        try:
            signal.setitimer(signal.ITIMER_REAL, limit_s)
            try:
                reply = check(request["gold"], request["pred"])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Interrupted:
            reply = {"equal": False, "error": f"math check timed out after {limit_s:g} s"}
        except Exception as e:  # RecursionError, MemoryError, sympy errors, ...
            reply = {"equal": False, "error": f"Math-Verify failed: {type(e).__name__}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve()
