"""Checks a rollout engine against the contract of :class:`~rllib_dph.engines.base.RolloutEngine`.

As Gymnasium's ``check_env`` checks an env, :func:`check_engine` checks an engine, on real
weights: it compares what the engine samples with a teacher-forced recompute of the same model
folder in ``transformers`` (float32, CPU)::

    from rllib_dph.engines.check import check_engine

    check_engine("hf")                           # a registered engine, on the bundled tiny-random
    check_engine("vllm", engine_kwargs={"max_model_len": 1024})
    check_engine(my_engine, model="/models/x")   # an engine already built on that folder, in float32

Each check is a function of a :class:`Subject` in :data:`CHECKS`, by name; a failed one raises
:class:`EngineCheckError` naming the engine, the check and what was wrong.
``tests/test_engine_conformance.py`` runs every check on every engine of ``ENGINES``.

The checks (tolerances: :data:`MU_ATOL`, :data:`TOPK_RTOL`):

- ``interface``: the :class:`RolloutEngine` members, ``from_pretrained`` a classmethod, a tokenizer;
- ``argument_check``: ``generate`` refuses bad :class:`SamplingParams` and empty prompts with
  ``ValueError`` naming the value (``engines.base.check_generate_args``);
- ``shapes_and_types``: ``n`` completions per prompt in prompt order, int64 token ids within the
  tokenizer's vocabulary, float32 μ finite and <= 0, no top-K unless asked, ``max_new_tokens``
  honoured with ``finish_reason`` ``"length"`` exactly there;
- ``greedy``: temperature 0 picks the reference's argmax (within :data:`MU_ATOL`), μ = 0, the n
  completions are equal, and the top-K are a point mass on the token;
- ``mu_equals_recompute``: μ of sampled tokens (temperatures 1 and 0.7) equals the recompute;
- ``top_k_logprobs``: (T, K) ids and log-probs, sorted, μ's top K with the sampled token among
  them exactly once, equal to the recompute, for K = 3 and K = ``MAX_TOP_K_LOGPROBS``;
- ``top_p``: an engine whose spec claims ``full_softmax_logprobs`` samples inside the nucleus and
  reports μ of the full tempered softmax; one that does not refuses ``top_p < 1``;
- ``seeded``: the same seed gives the same completions, another seed others, and equal prompts
  of one call are sampled independently;
- ``stops_at_eos``: on weights that make EOS likely, a completion ends at its first EOS (kept,
  ``"stop"``), greedy tokens stay the reference's argmax, and nothing follows a stop;
- ``update_weights``: new weights (numpy arrays) change the completions to the new reference's
  argmax, also for a prompt longer than a KV block seen before; the old weights (torch tensors)
  restore the old completions;
- ``lora``: an engine started with ``lora=`` serves a LoRA policy's adapter state: greedy tokens
  and μ equal a recompute on the merged weights, and a second adapter state replaces the first.

Every check leaves the engine on the weights it started the check with.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch

from rllib_dph.engines import ENGINES, EngineSpec, engine_class
from rllib_dph.engines.base import MAX_TOP_K_LOGPROBS, Completion, RolloutEngine, SamplingParams

#: Most |μ - recompute| (nats) in float32; engines agree to ~1e-6 with ``transformers``.
MU_ATOL = 1e-4
#: Relative tolerance of the top-K tail (log-probs near -5 to -8 of deep models differ by up to
#: 1.1e-4 between kernels) on top of :data:`MU_ATOL`.
TOPK_RTOL = 1e-4
#: The model checked when none is named: bundled, built in seconds, no download.
DEFAULT_MODEL = "tiny-random"
#: Prompt lengths of the checks (different, so that a batch is padded).
PROMPT_LENGTHS = (7, 1, 23)
#: Length of the ``update_weights`` check's extra prompt: longer than vLLM's KV block (128 tokens
#: on CPU), so that a prefix cache holds full blocks of it before the update.
LONG_PROMPT_LENGTH = 300
#: The LoRA settings the ``lora`` check serves.
LORA = {"r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0}


class EngineCheckError(AssertionError):
    """An engine broke its contract; the message names the engine, the check and the failure."""


@dataclass
class Subject:
    """An engine under check, with the reference it is compared with.

    Attributes:
        name: The engine's name in messages (its ``ENGINES`` key, or its class name).
        engine: The engine, holding :attr:`state`.
        folder: The model folder the engine and :attr:`reference` were loaded from.
        spec: Its ``ENGINES`` row; None for an unregistered engine (its ``top_p`` behaviour
            is then not checked against a claim).
        reference: The model in float32 on CPU, holding :attr:`state`: the teacher-forced recompute.
        state: The weights the engine holds (the reference's state dict).
        prompts: Token-id prompts of :data:`PROMPT_LENGTHS` and (last) :data:`LONG_PROMPT_LENGTH`,
            drawn from the tokenizer's vocabulary without its special tokens; the checks use
            the short ones (:attr:`short`), ``update_weights`` all.
        engine_kwargs: ``from_pretrained`` arguments of a second engine of the same kind (``lora``).
    """

    name: str
    engine: RolloutEngine
    folder: str
    spec: Optional[EngineSpec]
    reference: Any
    state: dict
    prompts: list[list[int]]
    engine_kwargs: dict = field(default_factory=dict)

    @classmethod
    def build(cls, engine: str | RolloutEngine, model: str = DEFAULT_MODEL, engine_kwargs=None) -> "Subject":
        """Builds the subject of :func:`check_engine` (same arguments)."""
        from rllib_dph.engines import make_engine
        from rllib_dph.models.hub import load_causal_lm
        from rllib_dph.models.build.prepare import prepare_model

        folder = prepare_model(model).location
        engine_kwargs = dict(engine_kwargs or {})
        if isinstance(engine, str):
            name, spec = engine, ENGINES.get(engine)
            engine = make_engine(name, folder, dtype="float32", **engine_kwargs)
        else:
            name, spec = type(engine).__name__, _spec_of(type(engine))
        if not isinstance(engine, RolloutEngine):
            missing = [m for m in ("tokenizer", "from_pretrained", "generate", "update_weights") if not hasattr(engine, m)]
            raise EngineCheckError(f"engine {name!r} is not a RolloutEngine: it has no {missing}")
        reference = load_causal_lm(folder, dtype=torch.float32).eval()
        state = _copy_state(reference.state_dict())
        engine.update_weights(state)  # the weights every check starts from, also for a given engine
        return cls(name, engine, folder, spec, reference, state, _prompts(engine.tokenizer), engine_kwargs)

    def fresh(self, **kwargs) -> RolloutEngine:
        """A second engine of the same class on the same folder, in float32."""
        return type(self.engine).from_pretrained(self.folder, dtype="float32", **self.engine_kwargs, **kwargs)

    @property
    def short(self) -> list[list[int]]:
        """The prompts of :data:`PROMPT_LENGTHS`."""
        return self.prompts[:-1]

    @property
    def stop_ids(self) -> set[int]:
        """The tokens that end a completion: the tokenizer's EOS and the model's generation-config EOS."""
        ids = {self.engine.tokenizer.eos_token_id}
        generation_eos = getattr(getattr(self.reference, "generation_config", None), "eos_token_id", None)
        ids.update([generation_eos] if isinstance(generation_eos, int) else generation_eos or [])
        return {int(i) for i in ids if i is not None}


def check_engine(
    engine: str | RolloutEngine,
    model: str = DEFAULT_MODEL,
    *,
    engine_kwargs: Optional[Mapping[str, Any]] = None,
    checks: Optional[Sequence[str]] = None,
) -> None:
    """Checks an engine against the ``RolloutEngine`` contract (see the module docstring).

    Args:
        engine: A key of ``ENGINES`` (the engine is built on ``model`` in float32), or an engine
            built on ``model`` in float32 (its weights are set to the folder's first).
        model: A bundled model name, model folder or Hugging Face id.
        engine_kwargs: ``from_pretrained`` arguments of the engines built here.
        checks: Names of :data:`CHECKS` to run; None runs all.

    Raises:
        EngineCheckError: The first check that failed, naming the engine and what was wrong.
        ValueError: A name in ``checks`` is not a check.
    """
    unknown = sorted(set(checks or ()) - set(CHECKS))
    if unknown:
        raise ValueError(f"checks={unknown} are not engine checks; choose from {sorted(CHECKS)}.")
    subject = Subject.build(engine, model, engine_kwargs)
    for name in checks or CHECKS:
        run_check(subject, name)


def run_check(subject: Subject, name: str) -> None:
    """Runs check ``name`` of :data:`CHECKS`; a failure raises :class:`EngineCheckError` naming it."""
    try:
        CHECKS[name](subject)
    except AssertionError as error:
        raise EngineCheckError(f"engine {subject.name!r} fails the {name!r} check: {error}") from error


# ---------------------------------------------------------------------------------- the checks


def check_interface(s: Subject) -> None:
    cls = type(s.engine)
    _require(isinstance(inspect.getattr_static(cls, "from_pretrained"), classmethod),
             f"{cls.__name__}.from_pretrained is not a classmethod")
    tokenizer = s.engine.tokenizer
    for member in ("eos_token_id", "decode", "apply_chat_template"):
        _require(hasattr(tokenizer, member), f"its tokenizer has no {member!r}")


def check_argument_check(s: Subject) -> None:
    bad = [
        (SamplingParams(n=0), "n=0"),
        (SamplingParams(temperature=-1.0), "temperature=-1.0"),
        (SamplingParams(top_p=0.0), "top_p=0.0"),
        (SamplingParams(max_new_tokens=0), "max_new_tokens=0"),
        (SamplingParams(top_k_logprobs=MAX_TOP_K_LOGPROBS + 1), f"top_k_logprobs={MAX_TOP_K_LOGPROBS + 1}"),
    ]
    for params, named in bad:
        _raises_naming(lambda: s.engine.generate(s.short[:1], params), named)
    _raises_naming(lambda: s.engine.generate([s.short[0], []], SamplingParams()), "prompt 1 is empty")


def check_shapes_and_types(s: Subject) -> None:
    for params in (SamplingParams(n=3, max_new_tokens=6, seed=0), SamplingParams(n=1, max_new_tokens=1, seed=0)):
        groups = s.engine.generate(s.short, params)
        _well_formed(s, groups, params)


def check_greedy(s: Subject) -> None:
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8, top_k_logprobs=3)
    groups = s.engine.generate(s.short, params)
    _well_formed(s, groups, params)
    for prompt, group in zip(s.short, groups):
        for c in group[1:]:
            np.testing.assert_array_equal(c.token_ids, group[0].token_ids, err_msg="greedy completions of a prompt differ")
        c = group[0]
        _assert_argmax(s.reference, prompt, c)
        np.testing.assert_array_equal(c.logprobs, 0.0, err_msg="greedy μ is not a point mass (0.0)")
        np.testing.assert_array_equal(c.topk_ids[:, 0], c.token_ids, err_msg="greedy top-1 is not the token")
        _require((c.topk_logprobs[:, 0] == 0).all() and (c.topk_logprobs[:, 1:] == -np.inf).all(),
                 "greedy top-K log-probs are not [0, -inf, ...]")


def check_mu_equals_recompute(s: Subject) -> None:
    for temperature in (1.0, 0.7):
        params = SamplingParams(n=3, temperature=temperature, max_new_tokens=12, seed=0)
        for prompt, c in _pairs(s.short, s.engine.generate(s.short, params)):
            logp = recompute_logp(s.reference, prompt, c.token_ids, temperature)
            np.testing.assert_allclose(c.logprobs, _at(logp, c.token_ids), atol=MU_ATOL,
                                       err_msg=f"μ at temperature {temperature} is not the recompute's")


def check_top_k_logprobs(s: Subject) -> None:
    temperature = 0.7
    for K in (3, MAX_TOP_K_LOGPROBS):
        params = SamplingParams(n=4, temperature=temperature, max_new_tokens=10, seed=2, top_k_logprobs=K)
        groups = s.engine.generate(s.short, params)
        _well_formed(s, groups, params)
        for prompt, c in _pairs(s.short, groups):
            _assert_top_k(c, recompute_logp(s.reference, prompt, c.token_ids, temperature), K)


def check_top_p(s: Subject) -> None:
    top_p, temperature = 0.6, 0.8
    params = SamplingParams(n=4, temperature=temperature, top_p=top_p, max_new_tokens=10, seed=1)
    try:
        groups = s.engine.generate(s.short, params)
    except ValueError as error:
        _require(s.spec is None or not s.spec.full_softmax_logprobs,
                 f"top_p={top_p} was refused ({error}) but ENGINES claims full_softmax_logprobs=True")
        _require(f"top_p={top_p}" in str(error), f"the refusal does not name top_p={top_p}: {error}")
        return
    _require(s.spec is None or s.spec.full_softmax_logprobs,
             f"top_p={top_p} was sampled but ENGINES claims full_softmax_logprobs=False: refuse it")
    for prompt, c in _pairs(s.short, groups):
        logp = recompute_logp(s.reference, prompt, c.token_ids, temperature)
        mu = _at(logp, c.token_ids)
        p = logp.exp()
        mass_before = (p * (p > torch.from_numpy(mu).exp()[:, None])).sum(-1)  # (T,) of likelier tokens
        _require(bool((mass_before < top_p + MU_ATOL).all()), f"a token outside the top_p={top_p} nucleus was drawn")
        np.testing.assert_allclose(c.logprobs, mu, atol=MU_ATOL, err_msg="μ under top_p is not the full softmax's")


def check_seeded(s: Subject) -> None:
    prompts = [s.short[2], s.short[2], s.short[0]]  # a repeated prompt
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=10, seed=5, top_k_logprobs=2)
    first, again = s.engine.generate(prompts, params), s.engine.generate(prompts, params)
    other = s.engine.generate(prompts, dataclasses.replace(params, seed=6))
    for (_, a), (_, b) in zip(_pairs(prompts, first), _pairs(prompts, again)):
        for column in ("token_ids", "logprobs", "topk_ids", "topk_logprobs"):
            np.testing.assert_array_equal(getattr(a, column), getattr(b, column),
                                          err_msg=f"the same seed gave other {column}")
    tokens = [[tuple(c.token_ids) for c in group] for group in first]
    _require(tokens != [[tuple(c.token_ids) for c in group] for group in other], "seeds 5 and 6 gave the same completions")
    _require(tokens[0] != tokens[1], "two equal prompts of one call got the same samples")


def check_stops_at_eos(s: Subject) -> None:
    eos = s.engine.tokenizer.eos_token_id
    state = eos_likely_state(s, eos)
    reference = _reference_on(s, state)
    try:
        s.engine.update_weights(state)
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
        groups = s.engine.generate(s.short, greedy)
        _well_formed(s, groups, greedy)
        for prompt, c in _pairs(s.short, groups):
            _assert_argmax(reference, prompt, c)
        _require(groups[0][0].finish_reason == "stop", "greedy decoding did not stop at EOS where it is the argmax")
        sampled = SamplingParams(n=8, temperature=1.0, max_new_tokens=8, seed=0)
        _well_formed(s, s.engine.generate(s.short, sampled), sampled)
    finally:
        s.engine.update_weights(s.state)


def check_update_weights(s: Subject) -> None:
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    before = s.engine.generate(s.prompts, params)  # also fills a prefix cache
    new_state = perturbed(s.state)
    reference = _reference_on(s, new_state)
    try:
        s.engine.update_weights({k: v.numpy() for k, v in new_state.items()})
        after = s.engine.generate(s.prompts, params)
        for prompt, c in _pairs(s.prompts, after):
            _assert_argmax(reference, prompt, c)
        _require(_tokens(after) != _tokens(before), "new weights left every completion unchanged")
    finally:
        s.engine.update_weights(s.state)
    _require(_tokens(s.engine.generate(s.prompts, params)) == _tokens(before),
             "loading the old weights back did not restore the old completions")


def check_lora(s: Subject) -> None:
    from rllib_dph.policy import lora

    engine = s.fresh(lora=LORA)
    try:
        previous = None
        for seed in (0, 1):
            policy = adapted_policy(s, seed)
            merged = _reference_on(s, lora.merged_state(policy))
            engine.update_weights(lora.adapter_state(policy, LORA))
            groups = engine.generate(s.short, SamplingParams(temperature=0.0, max_new_tokens=8))
            for prompt, group in zip(s.short, groups):
                _assert_argmax(merged, prompt, group[0])
            tokens = _tokens(groups)
            sampled = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=seed)
            for prompt, c in _pairs(s.short, engine.generate(s.short, sampled)):
                np.testing.assert_allclose(c.logprobs, _at(recompute_logp(merged, prompt, c.token_ids, 1.0), c.token_ids),
                                           atol=MU_ATOL, err_msg=f"μ under adapters {seed} is not the merged model's")
            _require(tokens != previous, "a second adapter state left the completions unchanged")
            previous = tokens
    finally:
        del engine
        gc.collect()


#: Every check, by name, in the order :func:`check_engine` runs them.
CHECKS: dict[str, Callable[[Subject], None]] = {
    "interface": check_interface,
    "argument_check": check_argument_check,
    "shapes_and_types": check_shapes_and_types,
    "greedy": check_greedy,
    "mu_equals_recompute": check_mu_equals_recompute,
    "top_k_logprobs": check_top_k_logprobs,
    "top_p": check_top_p,
    "seeded": check_seeded,
    "stops_at_eos": check_stops_at_eos,
    "update_weights": check_update_weights,
    "lora": check_lora,
}


# ---------------------------------------------------------------------------------- helpers


def recompute_logp(model, prompt: Sequence[int], response: Sequence[int], temperature: float) -> torch.Tensor:
    """Teacher-forced (T, V) float32 log_softmax(logits / temperature) at each response position."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
    return torch.log_softmax(logits / temperature, dim=-1)


def perturbed(state: Mapping[str, torch.Tensor], scale: float = 0.5, seed: int = 0) -> dict:
    """``state`` plus Gaussian noise; entries that share memory (tied weights) stay one tensor."""
    generator = torch.Generator().manual_seed(seed)
    noisy = {}  # data_ptr → perturbed tensor
    for value in state.values():
        if value.data_ptr() not in noisy:
            noisy[value.data_ptr()] = value + scale * torch.randn(value.shape, generator=generator)
    return {k: noisy[v.data_ptr()] for k, v in state.items()}


def eos_likely_state(s: Subject, eos: int) -> dict:
    """:attr:`Subject.state` with the output row of EOS set so that EOS is the argmax where the
    third greedy token of the first prompt was: that token's row scaled past its own logit
    (tied input embeddings change with it; EOS is never an input here)."""
    greedy = s.engine.generate(s.short[:1], SamplingParams(temperature=0.0, max_new_tokens=3))[0][0]
    step = len(greedy.token_ids) - 1
    token = int(greedy.token_ids[step])
    logit = _logits(s.reference, s.short[0], greedy.token_ids[:step])[-1, token]
    name = "lm_head.weight" if "lm_head.weight" in s.state else "model.embed_tokens.weight"
    head = s.state[name].clone()
    head[eos] = head[token] * (1.5 if logit > 0 else 0.5)
    return {k: head if v.data_ptr() == s.state[name].data_ptr() else v for k, v in s.state.items()}


def adapted_policy(s: Subject, seed: int):
    """The reference model with LoRA adapters of non-zero B (peft starts B at 0: the base model)."""
    from rllib_dph.models.hub import load_causal_lm
    from rllib_dph.policy import lora

    policy = lora.add_adapters(load_causal_lm(s.folder, dtype=torch.float32), LORA)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if lora.is_adapter_key(name):
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))
    return policy


def _copy_state(state: Mapping[str, torch.Tensor]) -> dict:
    """A copy of a state dict; entries that share memory (tied weights) stay one tensor."""
    copies = {}  # data_ptr → copy
    for value in state.values():
        copies.setdefault(value.data_ptr(), value.detach().clone())
    return {k: copies[v.data_ptr()] for k, v in state.items()}


def _reference_on(s: Subject, state: Mapping[str, torch.Tensor]):
    """A reference model (float32, CPU) holding ``state``."""
    from rllib_dph.models.hub import load_causal_lm

    model = load_causal_lm(s.folder, dtype=torch.float32).eval()
    model.load_state_dict(dict(state))
    return model


def _spec_of(cls: type) -> Optional[EngineSpec]:
    """The ``ENGINES`` row of an engine class, None when it has none."""
    for name, spec in ENGINES.items():
        try:
            if engine_class(name) is cls:
                return spec
        except ImportError:
            continue
    return None


def _prompts(tokenizer) -> list[list[int]]:
    """Prompts of :data:`PROMPT_LENGTHS` from the tokenizer's ordinary tokens (seeded)."""
    special = set(tokenizer.all_special_ids)
    ordinary = np.array([i for i in range(len(tokenizer)) if i not in special])
    rng = np.random.default_rng(0)
    return [rng.choice(ordinary, n).tolist() for n in (*PROMPT_LENGTHS, LONG_PROMPT_LENGTH)]


def _well_formed(s: Subject, groups: list[list[Completion]], params: SamplingParams) -> None:
    """The output contract of ``generate`` for ``s.short`` (see the module docstring)."""
    _require(isinstance(groups, list) and len(groups) == len(s.short),
             f"{len(groups)} groups for {len(s.short)} prompts")
    vocab, K, stops = len(s.engine.tokenizer), params.top_k_logprobs, s.stop_ids
    for i, group in enumerate(groups):
        _require(len(group) == params.n, f"prompt {i} got {len(group)} completions, n={params.n}")
        for c in group:
            T = len(c.token_ids)
            where = f"prompt {i}: "
            _require(isinstance(c, Completion), where + f"a {type(c).__name__}, not a Completion")
            _require(c.token_ids.dtype == np.int64 and c.token_ids.ndim == 1, where + "token_ids not (T,) int64")
            _require(c.logprobs.dtype == np.float32 and c.logprobs.shape == (T,), where + "logprobs not (T,) float32")
            _require(1 <= T <= params.max_new_tokens, where + f"{T} tokens, max_new_tokens={params.max_new_tokens}")
            _require(bool(((c.token_ids >= 0) & (c.token_ids < vocab)).all()), where + f"token id outside [0, {vocab})")
            _require(bool(np.isfinite(c.logprobs).all() and (c.logprobs <= 0).all()), where + "μ not finite and <= 0")
            stopped_at = [t for t, token in enumerate(c.token_ids.tolist()) if token in stops]
            if c.finish_reason == "stop":
                _require(stopped_at == [T - 1], where + f"'stop' but stop tokens at {stopped_at} of {T}")
            else:
                _require(c.finish_reason == "length", where + f"finish_reason={c.finish_reason!r}")
                _require(T == params.max_new_tokens and not stopped_at,
                         where + f"'length' with {T} tokens and stop tokens at {stopped_at}")
            if K:
                for column, dtype in (("topk_ids", np.int64), ("topk_logprobs", np.float32)):
                    value = getattr(c, column)
                    _require(isinstance(value, np.ndarray) and value.shape == (T, K) and value.dtype == dtype,
                             where + f"{column} is not a (T, K) = ({T}, {K}) {np.dtype(dtype)} array: {value!r:.60}")
            else:
                _require(c.topk_ids is None and c.topk_logprobs is None, where + "top-K given with top_k_logprobs=0")


def _assert_top_k(c: Completion, logp: torch.Tensor, K: int) -> None:
    """``c``'s top-K against the recompute ``logp`` (T, V) (see ``SamplingParams.top_k_logprobs``)."""
    T = len(c.token_ids)
    tol = dict(atol=MU_ATOL, rtol=TOPK_RTOL)
    _require(bool(((c.topk_ids == c.token_ids[:, None]).sum(-1) == 1).all()), "the sampled token is not in the top K once")
    np.testing.assert_allclose(c.topk_logprobs, logp.gather(1, torch.from_numpy(c.topk_ids)).numpy(), **tol,
                               err_msg="top-K log-probs are not the recompute's at their ids")
    top_values = logp.topk(K, dim=-1).values.numpy()  # (T, K)
    np.testing.assert_allclose(c.topk_logprobs[:, :-1], top_values[:, :-1], **tol,
                               err_msg="the first K-1 entries are not μ's most likely tokens")
    in_top = (c.topk_ids[:, :-1] == c.token_ids[:, None]).any(-1)  # else the K-th entry may be the sampled token
    np.testing.assert_allclose(c.topk_logprobs[in_top, -1], top_values[in_top, -1], **tol,
                               err_msg="the K-th entry is neither μ's K-th token nor the sampled token")
    _require(bool((np.diff(c.topk_logprobs[:, :-1], axis=-1) <= 0).all()), "top-K log-probs are not sorted descending")
    position = (c.topk_ids == c.token_ids[:, None]).argmax(-1)
    np.testing.assert_allclose(c.topk_logprobs[np.arange(T), position], c.logprobs, atol=1e-6,
                               err_msg="the sampled token's top-K entry is not its μ")


def _assert_argmax(model, prompt: Sequence[int], c: Completion) -> None:
    """Each token of ``c`` is an argmax of ``model``'s logits (within :data:`MU_ATOL`) after the tokens before it."""
    logits = _logits(model, prompt, c.token_ids[:-1])  # (T, V)
    chosen = logits[torch.arange(len(c.token_ids)), torch.from_numpy(c.token_ids)]
    gap = (logits.max(-1).values - chosen).max().item()
    _require(gap <= MU_ATOL, f"a greedy token's logit is {gap:.2e} below the reference's largest")


def _logits(model, prompt: Sequence[int], response: Sequence[int]) -> torch.Tensor:
    """(len(response) + 1, V) float32 next-token logits after the prompt and each response token."""
    ids = torch.tensor([list(prompt) + [int(t) for t in response]])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, len(prompt) - 1 :].float()


def _at(logp: torch.Tensor, tokens: np.ndarray) -> np.ndarray:
    return logp[torch.arange(len(tokens)), torch.from_numpy(tokens)].numpy()


def _pairs(prompts, groups):
    return [(prompt, c) for prompt, group in zip(prompts, groups) for c in group]


def _tokens(groups) -> list[list[tuple]]:
    return [[tuple(c.token_ids.tolist()) for c in group] for group in groups]


def _raises_naming(call: Callable[[], Any], named: str) -> None:
    try:
        call()
    except ValueError as error:
        _require(named in str(error), f"the ValueError does not name {named!r}: {error}")
        return
    raise AssertionError(f"generate accepted {named}; it must raise ValueError naming it")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)
