"""Any reasoning-gym data set as a verifier env: ``rllib_dph/ReasoningGym-v0``.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates procedural tasks
(countdown, sudoku, chain sums, ... about a hundred data sets) with a scorer per data set. This
env serves one of them::

    import gymnasium as gym
    import rllib_dph.envs

    env = gym.make("rllib_dph/ReasoningGym-v0", dataset="countdown",
                   config={"min_numbers": 3, "max_numbers": 4}, size=200, seed=0)

or ``config.environment("rllib_dph/ReasoningGym-v0", env_config={"dataset": "countdown", ...})``.
Install the optional extra first: ``pip install -e ".[reasoning-gym]"``.

- **Data**: ``reasoning_gym.create_dataset(dataset, seed=..., size=..., **config)``; item ``i``
  is task ``i`` (id ``<dataset>/<split>/s<seed>/<i>``).
- **Splits** (``split``): ``"train"`` is the data set at ``seed``; ``"test"`` is the data set at
  ``seed + TEST_SEED_OFFSET`` (reasoning-gym seeds item ``i`` with ``seed + i``, so nearby seeds
  share items), with every question that also appears among the first ``train_size`` train
  items left out. So a train env and a test env of the same ``dataset``, ``config`` and ``seed``
  never share a question.
- **A subset** (``data``): a file of task rows whose ``id`` column names this split's tasks
  (DPH's ``d_exp.parquet``; DPH samples its exploration prompts from it through ``data``, as for
  every env) keeps only those tasks; each row's prompt must be the task's prompt now.
- **Prompt**: the data set's own question (with its format instructions) as the user message,
  after reasoning-gym's own system prompt (``system_prompt``: a key of
  ``reasoning_gym.utils.SYSTEM_PROMPTS``, default ``"default"``, which asks for the answer in
  ``<answer>...</answer>``; or your own text; or None); the engine applies the model's chat
  template, as for every env.
- **Reward**: the data set's own ``score_answer(answer, entry)`` on the content of the last
  ``<answer>...</answer>`` block (:func:`extract_answer`: reasoning-gym's own rule, in linear
  time): every scorer of reasoning-gym 0.1.25 takes that extracted answer, not the raw
  completion. Partial credit is
  kept as the reward (countdown gives 0.05 to an expression that uses other numbers). A
  completion without an ``<answer>`` block scores 0 with ``info["error"]`` saying so, without
  calling the scorer (whose own value for a missing answer, e.g. countdown's 0.01, would
  reward no answer at all).
- **Correct** (pass@k, ``info["correct"]``): reward >= ``correct_threshold``, by default 1.0
  (full credit).
- **Time limit and isolation**: the scorer runs in the one verifier isolation
  (``rllib_dph.envs.isolation``), in a checker subprocess (several scorers evaluate the answer
  as Python: countdown's ``sympy.parse_expr``, ``eval`` in n_queens, spiral_matrix, ...), under
  the verifier time limit of every registered env, ``verifier_timeout_s`` (default
  ``rllib_dph.envs.base.DEFAULT_VERIFIER_TIMEOUT_S``, wall clock; None: no time limit, still
  isolated), and a memory limit (:data:`SCORER_MEMORY_BYTES`). A call past the time limit
  scores 0 with the reason in ``info["error"]`` and the checker is killed (an answer like
  ``9**9**9**9`` never returns); a scorer that raises, or a checker that dies, scores 0 with the
  reason. Importing reasoning-gym in a checker is not charged to the limit. It isolates hangs
  and crashes; it is no security sandbox: a scorer that evaluates its answer runs it as Python
  in that process, with this process's rights. :data:`ANSWER_CHECKS` keeps what is not
  arithmetic away from countdown's scorer; n_queens, spiral_matrix, binary_matrix and
  string_insertion ``eval`` their answers, and the integration and polynomial data sets
  ``sympy.parse_expr`` them, unchecked here.
- **Solution styles**: countdown completions are named by :func:`countdown_style` (operator
  pattern, parentheses, number order); evaluation reports pass@k per style and the number of
  distinct correct answers (the extracted answer without whitespace is the solution key).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

from rllib_dph.envs.arguments import check_real
from rllib_dph.envs.base import DEFAULT_VERIFIER_TIMEOUT_S, Task, Verdict, VerifierEnv
from rllib_dph.envs.isolation import Limits
from rllib_dph.envs.multiturn import tag_content
from rllib_dph.envs.registry import _check_verifier_timeout

logger = logging.getLogger(__name__)

#: The install command named when reasoning-gym is missing.
INSTALL_HINT = 'pip install -e ".[reasoning-gym]"  (or: pip install "reasoning-gym>=0.1.25,<0.2")'
#: Added to ``seed`` for the test split: reasoning-gym seeds item i with seed + i, so the test
#: items' seeds lie far from the train items' seeds.
TEST_SEED_OFFSET = 2**31
#: Items per split unless ``size`` says otherwise, and the train size a test split is checked
#: against unless ``train_size`` says otherwise.
DEFAULT_SIZE = 1000
#: Splits of :class:`ReasoningGymEnv`.
SPLITS = ("train", "test")
#: Memory a scorer call may add to its checker (the isolation's memory limit).
SCORER_MEMORY_BYTES = 2 << 30
#: The style :func:`countdown_style` gives a completion without a parsable expression (the
#: evaluation's "no style", counted by no style metric).
NO_STYLE = "none"

_ARITHMETIC = re.compile(r"[\d\s+\-*/().]+")
_INTEGER = re.compile(r"\d+")
_OPERATOR = re.compile(r"\*\*|//|[+\-*/]")  # "**" (power) and "//" before "*" and "/"
#: Longest countdown expression :func:`countdown_shape` parses (longer: no shape).
_MAX_EXPRESSION_CHARS = 512


def import_reasoning_gym():
    """The ``reasoning_gym`` module; ImportError naming the install command when it is missing."""
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError(
            f"rllib_dph/ReasoningGym-v0 needs the reasoning-gym package ({e}); install it with {INSTALL_HINT}."
        ) from e
    return reasoning_gym


_answer_block = tag_content("answer")


def extract_answer(completion: str) -> str | None:
    """The content of the last complete ``<answer>...</answer>`` block, stripped, or None when
    there is none: reasoning-gym's own ``reasoning_gym.utils.extract_answer`` in linear time (its
    non-greedy regex rescans the rest of the completion from each unclosed ``<answer>``:
    80,000 characters of them took 30 s). Of nested openings the innermost counts."""
    return _answer_block(completion)


def _fold(answer: str | None) -> str | None:
    """An answer without whitespace (None when empty): the key of equal answers."""
    if answer is None:
        return None
    return "".join(answer.split()) or None


# ----------------------------------------------------------------------------- countdown styles
def countdown_shape(expression: str, numbers: Sequence[int]) -> tuple[str, int, str] | None:
    """The shape of a countdown expression: ``(operators, parentheses, order)``, or None when
    ``expression`` is not plain integer arithmetic (digits, ``+ - * /``, parentheses, spaces).

    - ``operators``: the operators in reading order, e.g. ``"*--"`` for ``94*4 - 61 - 6``
      (``**`` is written ``^``);
    - ``parentheses``: the number of parenthesis pairs written (``(94*4)-61-6``: 1);
    - ``order``: the order of its numbers against ``numbers`` (the order the question lists
      them): ``"given"`` (the same order), else ``"ascending"`` or ``"descending"`` (sorted),
      else ``"mixed"``. A list the question already gives sorted is ``"given"``.

    The expression is read as text (never evaluated); it need not be correct.
    """
    if len(expression) > _MAX_EXPRESSION_CHARS or not is_arithmetic(expression):
        return None
    if expression.count("(") != expression.count(")"):
        return None
    used = [int(n) for n in _INTEGER.findall(expression)]
    if not used:
        return None
    if used == list(numbers):
        order = "given"
    elif used == sorted(used):
        order = "ascending"
    elif used == sorted(used, reverse=True):
        order = "descending"
    else:
        order = "mixed"
    operators = "".join("^" if op == "**" else op for op in _OPERATOR.findall(expression))
    return operators, expression.count("("), order


def countdown_style(completion: str, task: Task) -> str | None:
    """The solution style of a countdown completion: ``"<operators>,p<parentheses>,<order>"``
    of its ``<answer>`` expression (:func:`countdown_shape`), e.g. ``"*--,p0,given"``; None when
    it has no ``<answer>`` block or the block is not integer arithmetic.

    A style function for evaluation: ``EvalSettings(style_fn=countdown_style)``, or
    ``rllib evaluate --style-fn rllib_dph.envs.reasoning_gym:countdown_style``; the
    ``countdown`` data set of ``rllib_dph/ReasoningGym-v0`` names its styles with it already.

    Args:
        completion: The model's completion.
        task: A countdown task of ``rllib_dph/ReasoningGym-v0`` (its ground truth holds the
            question's ``numbers``).

    Raises:
        ValueError: ``task`` is not a countdown task.
    """
    try:
        numbers = task.ground_truth["metadata"]["numbers"]
    except (TypeError, KeyError) as e:
        raise ValueError(
            f"countdown_style: task {task.id} ({task.data_source}) has no countdown numbers "
            f"(ground_truth['metadata']['numbers']: {type(e).__name__} {e}); use it on "
            "rllib_dph/ReasoningGym-v0 with dataset='countdown'."
        ) from None
    answer = extract_answer(completion)
    shape = None if answer is None else countdown_shape(answer, numbers)
    if shape is None:
        return None
    operators, parentheses, order = shape
    return f"{operators},p{parentheses},{order}"


def is_arithmetic(answer: str) -> bool:
    """Whether ``answer`` is integer arithmetic text: digits, ``+ - * / ( ) .`` and spaces."""
    return _ARITHMETIC.fullmatch(answer) is not None


#: Checks of an extracted answer before the data set's scorer sees it: ``dataset -> (check,
#: rule)``. Countdown's scorer evaluates its answer with ``sympy.parse_expr`` (Python ``eval``),
#: so an answer with names or calls in it is not sent there: it scores 0 with the rule in
#: ``info["error"]`` (countdown's own scorer would give such an answer 0.01 or 0.05).
ANSWER_CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "countdown": (is_arithmetic, "an arithmetic expression of digits, + - * / and parentheses"),
}

#: Style functions of data sets that name solution styles (used by ``solution_style``).
STYLE_FUNCTIONS: dict[str, Callable[[str, Task], str | None]] = {"countdown": countdown_style}


# ----------------------------------------------------------------------------- scoring
#: Data sets a checker keeps built for scoring (each holds its items' generator state).
SCORER_DATASETS = 8
_datasets: OrderedDict[str, Any] = OrderedDict()


def score_completion(completion: str, entry: Mapping[str, Any], *, dataset: str, scorer_kwargs: Mapping[str, Any],
                     correct_threshold: float) -> Verdict:
    """The verdict of the data set's own scorer on the completion's ``<answer>`` block (the
    verifier of :class:`ReasoningGymEnv`, run in a checker of the isolation): 0 with the reason
    without an answer, for an answer :data:`ANSWER_CHECKS` refuses, or when the scorer raises or
    returns no number."""
    answer = extract_answer(completion)
    if answer is None:
        return Verdict(0.0, False, "no <answer>...</answer> block in the completion")
    check, rule = ANSWER_CHECKS.get(dataset, (None, ""))
    if check is not None and not check(answer):
        return Verdict(0.0, False, f"the answer {answer[:80]!r} is not {rule}")
    try:
        key = json.dumps([dataset, scorer_kwargs], sort_keys=True, default=str)
        if key not in _datasets:
            _datasets[key] = import_reasoning_gym().create_dataset(dataset, **scorer_kwargs)
            if len(_datasets) > SCORER_DATASETS:
                _datasets.popitem(last=False)
        _datasets.move_to_end(key)
        score = _datasets[key].score_answer(answer, entry)
    except Exception as e:  # the answer's fault, or the scorer's: reported, never fatal
        return Verdict(0.0, False, f"score_answer raised {type(e).__name__}: {str(e)[:300]}")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return Verdict(0.0, False, f"score_answer returned {score!r:.80}, not a number")
    return Verdict(float(score), score >= correct_threshold)


def _load_reasoning_gym() -> None:
    """The ``prepare`` of a scoring checker: imports reasoning-gym (not charged to the limit)."""
    import_reasoning_gym()


# ----------------------------------------------------------------------------- the env
def _system_text(system_prompt: str | None) -> str | None:
    """reasoning-gym's system prompt of that name, the text itself, or None."""
    if system_prompt is None:
        return None
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS.get(system_prompt, system_prompt)


def generate_items(
    dataset: str, config: Mapping[str, Any], *, size: int, seed: int, split: str, train_size: int
) -> list[tuple[int, dict]]:
    """The ``(index, entry)`` items of a split (see the module docstring), in index order.

    Raises:
        ValueError: The test split cannot get ``size`` questions that are not train questions
            within ``size + train_size`` items (the data set's config has too few distinct
            questions).
    """
    rg = import_reasoning_gym()
    if split == "train":
        data = rg.create_dataset(dataset, seed=seed, size=size, **config)
        return [(i, data[i]) for i in range(size)]
    train = rg.create_dataset(dataset, seed=seed, size=train_size, **config)
    train_questions = {train[i]["question"] for i in range(train_size)}
    limit = size + train_size
    test = rg.create_dataset(dataset, seed=seed + TEST_SEED_OFFSET, size=limit, **config)
    items = []
    for i in range(limit):
        entry = test[i]
        if entry["question"] not in train_questions:
            items.append((i, entry))
            if len(items) == size:
                return items
    raise ValueError(
        f"ReasoningGymEnv: the test split of {dataset!r} (config {dict(config)}) found only {len(items)} of "
        f"size={size} questions outside the {train_size} train questions among {limit} items; the config "
        "has too few distinct questions: lower size or train_size, or widen the config."
    )


def tasks_named_in(tasks: Sequence[Task], data: str | os.PathLike, where: str) -> list[Task]:
    """The tasks of ``tasks`` whose ids the rows of ``data`` name (a parquet or jsonl file of
    ``id`` and ``prompt``), in the order of ``tasks``.

    Raises:
        ValueError: A row names no task of ``tasks``, or its prompt is not that task's prompt
            (the file was made from other data or another config).
    """
    from rllib_dph.envs.data import load_tasks

    by_id = {task.id: task for task in tasks}
    wanted = set()
    for row, named in enumerate(load_tasks(data, task="generic")):
        task = by_id.get(named.id)
        if task is None:
            raise ValueError(f"{where}: data={str(data)!r} row {row} names task {named.id!r}, which this split does "
                             f"not have (its ids run {tasks[0].id} ... {tasks[-1].id}); make the file from this "
                             "dataset, config, seed, size and split.")
        if [dict(m) for m in named.messages] != [dict(m) for m in task.messages]:
            raise ValueError(f"{where}: data={str(data)!r} row {row} ({named.id!r}) has another prompt than the "
                             "task of that id now; the file was made from another config or reasoning-gym version: "
                             "make it again.")
        wanted.add(named.id)
    return [task for task in tasks if task.id in wanted]


def _check_arguments(where: str, dataset: str, config: Mapping[str, Any], *, size: Any, seed: Any, split: Any,
                     train_size: Any) -> None:
    """Raises ValueError naming the first argument of :class:`ReasoningGymEnv` out of its rule,
    or the config that reasoning-gym refuses."""
    rg = import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    rules = [
        (dataset in DATASETS, f"dataset={dataset!r} is not a reasoning-gym data set; use one of {sorted(DATASETS)}"),
        (not {"seed", "size"} & set(config), f"config={dict(config)} sets seed or size; give them as the env's own "
                                             "seed= and size= arguments"),
        (split in SPLITS, f"split={split!r} must be one of {SPLITS}"),
        (isinstance(size, int) and size >= 1, f"size={size!r} must be an int >= 1"),
        (isinstance(train_size, int) and train_size >= 1, f"train_size={train_size!r} must be an int >= 1"),
        (isinstance(seed, int) and seed >= 0, f"seed={seed!r} must be an int >= 0"),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(f"{where}: {message}.")
    try:
        rg.create_dataset(dataset, seed=seed, size=1, **config)  # the config's own checks
    except (TypeError, AssertionError, ValueError) as e:
        raise ValueError(f"{where}: config={dict(config)} is refused by reasoning-gym: {type(e).__name__}: {e}.") from e


class ReasoningGymEnv(VerifierEnv):
    """A reasoning-gym data set as a single-turn verifier env (module docstring).

    ## Description
    Each episode is one item of the data set: the observation is its question (with the data
    set's format instructions and reasoning-gym's system prompt), the action is the model's
    complete answer, scored by the data set's own scorer on its last ``<answer>`` block.

    ## Action Space
    ``spaces.Text`` over printable characters; ``step`` accepts any ``str``.

    ## Observation Space
    ``spaces.Text``: the prompt text (system prompt and question, joined by a blank line).

    ## Rewards
    ``score_answer(answer, entry)`` in [0, 1], partial credit kept; 0 without an ``<answer>``
    block, when the scorer raises, returns no number, or runs past ``verifier_timeout_s``.

    ## Starting State
    An item drawn uniformly with ``self.np_random``, or the one given by ``options={"index": i}``.

    ## Episode End
    Always terminated after one step; never truncated.

    ## Info
    ``task_id``, ``data_source`` (``reasoning_gym/<dataset>``), ``index``, ``messages``; after
    ``step`` also ``correct`` (reward >= ``correct_threshold``) and, when the answer was missing
    or could not be scored, ``error``.

    ## Arguments
    Args:
        dataset: A reasoning-gym data set name (``reasoning_gym.factory.DATASETS``), e.g.
            ``"countdown"``.
        config: The data set's config fields (its ``*Config`` dataclass), e.g.
            ``{"min_numbers": 3, "max_numbers": 4}``; ``seed`` and ``size`` are set by this env.
        size: Items in this split, >= 1.
        seed: The train split's seed (the test split's is ``seed + TEST_SEED_OFFSET``).
        split: ``"train"`` or ``"test"``.
        train_size: The train split size that a test split leaves out (default
            :data:`DEFAULT_SIZE`; give your train env's ``size``).
        system_prompt: A key of ``reasoning_gym.utils.SYSTEM_PROMPTS`` (default ``"default"``),
            your own text, or None (no system message).
        correct_threshold: Reward that counts as correct, in (0, 1]; default 1.0 (full credit).
        verifier_timeout_s: Wall-clock limit of one scorer call in seconds (default
            ``DEFAULT_VERIFIER_TIMEOUT_S``, as for every registered env); None: no limit.
        data: A ``.parquet`` or ``.jsonl`` file of task rows (``id`` and ``prompt``, the layout of
            pre-sampling's ``d_exp.parquet``): only the tasks it names, in this split's order;
            None: every task of the split.
    """

    def __init__(
        self,
        dataset: str = "countdown",
        *,
        config: Mapping[str, Any] | None = None,
        size: int = DEFAULT_SIZE,
        seed: int = 0,
        split: str = "train",
        train_size: int = DEFAULT_SIZE,
        system_prompt: str | None = "default",
        correct_threshold: float = 1.0,
        verifier_timeout_s: float | None = DEFAULT_VERIFIER_TIMEOUT_S,
        data: str | os.PathLike | None = None,
    ):
        where = f"ReasoningGymEnv({dataset!r})"
        config = dict(config or {})
        _check_arguments(where, dataset, config, size=size, seed=seed, split=split, train_size=train_size)
        self.correct_threshold = check_real(correct_threshold, "correct_threshold", low=1e-9, high=1.0,
                                            where=where, default=1.0)
        self.verifier_timeout_s = _check_verifier_timeout(verifier_timeout_s, where)
        self.dataset_name = dataset
        self.dataset_config = config
        self.split = split
        self.seed = seed
        split_seed = seed if split == "train" else seed + TEST_SEED_OFFSET
        self._scorer_kwargs = dict(config, seed=split_seed, size=size if split == "train" else size + train_size)
        items = generate_items(dataset, config, size=size, seed=seed, split=split, train_size=train_size)
        system = _system_text(system_prompt)
        tasks = [
            Task(
                id=f"{dataset}/{split}/s{seed}/{i}",
                data_source=f"reasoning_gym/{dataset}",
                messages=tuple(([{"role": "system", "content": system}] if system else [])
                               + [{"role": "user", "content": entry["question"]}]),
                ground_truth=entry,
                meta={"split": split, "source_index": i},
            )
            for i, entry in items
        ]
        if data is not None:
            tasks = tasks_named_in(tasks, data, where)
        verifier = functools.partial(score_completion, dataset=dataset, scorer_kwargs=self._scorer_kwargs,
                                     correct_threshold=self.correct_threshold)
        limits = Limits(wall_s=self.verifier_timeout_s, memory_bytes=SCORER_MEMORY_BYTES,
                        setting="verifier_timeout_s", prepare=_load_reasoning_gym)
        super().__init__(tasks, verifier, name=f"ReasoningGym-{dataset}", limits=limits)

    def answer_key(self, index: int, completion: str) -> str | None:
        """The extracted answer without whitespace (None: no ``<answer>`` block)."""
        return _fold(extract_answer(completion))

    def solution_key(self, index: int, completion: str) -> str | None:
        """The extracted answer without whitespace: ``94*4 - 61 - 6`` and ``94*4-61-6`` are one
        solution, ``4*94 - 6 - 61`` another."""
        return _fold(extract_answer(completion))

    def solution_style(self, index: int, completion: str, suite: str | None = None) -> str | None:
        """The data set's style (:data:`STYLE_FUNCTIONS`; ``"none"`` when it names none for this
        completion), or None for data sets without a style function."""
        style_fn = STYLE_FUNCTIONS.get(self.dataset_name)
        if style_fn is None:
            return None
        return style_fn(completion, self.tasks[index]) or NO_STYLE

