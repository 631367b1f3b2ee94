"""DPH-RL's pre-sampling stage (paper §4.1): split the training prompts into D_pef and D_exp.

1. **Sample**: k completions per training prompt from the base policy, verified by the env.
2. **Split**: prompts with at least ``min_correct`` of k correct are D_pef candidates; the rest
   form D_exp.
3. **Keep** the reference responses of each candidate (``PresampleConfig.pef_samples``):

   - ``"all"``: every correct sample of the k (the paper's recommended "8 of 8" recipe, §6.2 and
     Table 4: "we retain all 8 sampled trajectories for each instance during training");
   - ``"refine"``: one more sample per candidate (the refinement sample, §4.1); the prompt stays
     in D_pef only if it is correct, else it moves to D_exp;
   - an integer n: the first n correct samples of the k.

   Each kept response's per-token log-probs under the base policy at the sampling temperature
   (the engine's μ, computed once here) are stored with it, so training needs no reference model.
   ``full_data=True`` keeps every prompt in D_exp too (Table 4's "Full Data": D_pef and D_exp
   both the whole data set, with ``min_correct=1``).

Output (``out_dir``), all parquet files written with pyarrow:

``d_pef.parquet`` — one row per reference trajectory (several per prompt with
``pef_samples="all"`` or n > 1, in prompt order):
    ``id`` (str), ``data_source`` (str), ``prompt`` (list<struct<role, content>>),
    ``reward_model`` (struct<style, ground_truth>), ``prompt_ids`` (list<int32>),
    ``response_ids`` (list<int32>, the reference response, EOS included), ``ref_logp``
    (list<float32>, log π_ref of each response token at ``temperature``), ``response`` (str),
    ``pass_count`` (int32, correct samples out of ``k``), ``sample_index`` (int32: which of the
    k samples it is, or ``k`` for the refinement sample).
``d_exp.parquet`` — the D_exp prompts in the original DPH-RL / verl layout (``id``,
    ``data_source``, ``prompt``, ``reward_model``): a valid ``data=`` input of the env.
``summary.json`` — sizes, pass rates, settings.

Both parquet files carry schema metadata ``rllib_dph.model_fingerprint`` (weights + tokenizer),
``rllib_dph.model_name``, how the reference responses were sampled (``rllib_dph.temperature``,
``rllib_dph.top_p``, ``rllib_dph.max_response_length``, ``rllib_dph.chat_template_sha`` — a hash
of the tokenizer's chat template, "none" without one), ``rllib_dph.k``, ``rllib_dph.min_correct``
``rllib_dph.pef_samples``, ``rllib_dph.full_data``, ``rllib_dph.schema_version`` (3: one row
per trajectory) and, for SQL, ``rllib_dph.db_root``. A run holds ``out_dir/.lock``
(:func:`presample_lock`), so two processes (e.g. Tune trials) never sample one directory at once.
Every file is written atomically (``rllib_dph.files``), and ``d_pef.parquet`` last: a run killed
at any point leaves no D_pef file that a later run would take for a finished one. Each parquet
file has its sha256 in ``<file>.sha256`` beside it, and every read checks it
(:func:`read_presampled`): a corrupted or truncated file is refused naming the fix, never trained on.
Intermediate results live in ``out_dir/parts/`` one file per chunk of prompts: an interrupted
run resumes at the first missing chunk
and never duplicates rows; chunk seeds depend only on the chunk, so a resumed run gives the same
files as an uninterrupted one. ``out_dir/identity.json`` records what the files were made from
(model fingerprint, a hash of the prompts, the sampling settings); a run for anything else — a
rebuilt model, changed data — moves them to ``out_dir/stale/<n>/`` first and samples anew.

The k samples of stage 1 depend on the model, the prompts, k, the sampling settings, the seed,
the chunking and the engine, not on ``min_correct``, ``pef_samples`` or ``full_data``: each
sample part is also kept in ``$RLLIB_DPH_HOME/presample/samples/<key>/`` (:func:`sample_key`; a
hard link where the file system allows, else a copy), and a directory made with the same
sampling takes its parts from there instead of sampling them again. So Table 4's rows (8/8, 7/8,
..., "full data") and the ``pef_samples`` variants of one seed sample once. The samples are those
of the process that drew them first (torch's thread count can change the rounding, and so the
draws); delete the folder to draw them again.

Training uses the files through :func:`prepare_pef`, the one place that decides whether they can be
used: it pre-samples or reuses ``DPHConfig.presample.out_dir`` and refuses a D_pef file whose ``identity.json``
names another model or other sampling settings than training's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import sys
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rllib_dph.algorithms.rules import BoolRule, NumberRule, first_violation
from rllib_dph.engines import DEFAULT_ENGINE, build_engine
from rllib_dph.engines.base import SamplingParams
from rllib_dph.files import (
    ChecksumError,
    atomic_path,
    checksum_path,
    file_lock,
    home,
    read_verified,
    remove_leftovers,
    sha256_of,
    write_bytes_atomic,
    write_checksum,
    write_json_atomic,
)
from rllib_dph.models.hub import model_fingerprint, resolve_model
from rllib_dph.envs import make_env
from rllib_dph.rollout.episodes import encode_task, rollout_chunks

PEF_FILE = "d_pef.parquet"
EXP_FILE = "d_exp.parquet"
SUMMARY_FILE = "summary.json"
META_PREFIX = "rllib_dph."
LOCK_FILE = ".lock"
#: What a directory's files were made from (:func:`run_identity`); a run for anything else sets them aside.
IDENTITY_FILE = "identity.json"
#: Sub-folder that receives the files of a directory made for another run (nothing is deleted).
STALE_DIR = "stale"
#: Sampling settings a D_pef file records (its ``identity.json`` and parquet metadata keys, named as
#: in the training config) and training must match (see :func:`prepare_pef`), each with the
#: :class:`~rllib_dph.engines.base.SamplingParams` field it is read from.
SAMPLING_SETTINGS = {"temperature": "temperature", "top_p": "top_p", "max_response_length": "max_new_tokens"}
#: The ``PresampleConfig`` fields that decide which prompts and trajectories D_pef holds (the
#: paper's Table 4 rows: k, the "m of k" threshold, the trajectories kept, "full data").
SELECTION_SETTINGS = ("k", "min_correct", "pef_samples", "full_data")
#: Where stage 1's sample parts are kept for every directory with the same sampling (under ``home()``).
SHARED_SAMPLES_DIR = pathlib.Path("presample") / "samples"
#: The settings of :func:`identity_settings` that choose among the samples rather than draw them.
CHOICE_SETTINGS = tuple(name for name in SELECTION_SETTINGS if name != "k")
#: Version of the D_pef file layout: 3 = one row per trajectory, ``pef_samples`` recorded.
SCHEMA_VERSION = 3
#: The named choices of ``PresampleConfig.pef_samples`` (an integer n >= 1 is the third kind).
PEF_SAMPLES_CHOICES = ("all", "refine")


@dataclass
class PresampleConfig:
    """Settings of the pre-sampling stage; ``DPHConfig`` embeds one (``DPHConfig.presample``).

    Attributes:
        model_name: Base policy (tiny model name, local path or HF id).
        env: Env id (e.g. ``"rllib_dph/SQL-v0"``) whose training prompts are split.
        env_config: Env kwargs (e.g. ``{"data": "sql_synth/train"}``).
        out_dir: Output directory.
        k: Samples per prompt (paper: 8).
        min_correct: m: a prompt is a D_pef candidate with >= m of k correct (paper: 7 of 8;
            Table 4's recommended setting 8 of 8).
        pef_samples: Reference responses kept per D_pef prompt: ``"all"`` (every correct sample
            of the k, the paper's "8 of 8" recipe), ``"refine"`` (one refinement sample, §4.1),
            or an integer n >= 1 (the first n correct samples of the k).
        full_data: Keep every prompt in D_exp as well (Table 4's "Full Data", with
            ``min_correct=1``); default False: D_exp is the prompts not in D_pef.
        sampling: How every sample is drawn, one ``engines.base.SamplingParams`` (a dict is read
            as its fields): training's
            (``GRPOConfig.sampling_params``); chunk c uses ``seed + c`` (None counts as 0); ``n``
            stays 1, the stage draws ``k`` per prompt (one per refinement).
        prompts_per_chunk: Prompts per generation call and per resumable part file.
        engine, engine_kwargs, dtype: Rollout engine settings (see ``GRPOConfig.llm``).
        num_gpus_per_env_runner: > 0 puts the engine on the GPU (same meaning as in RLlib).

    Inside a ``DPHConfig`` the fields of :data:`TRAINING_FIELDS` come from the training config
    (``DPHConfig.presample_config``) and stay at their defaults here.
    """

    model_name: Optional[str] = None
    env: Optional[str] = None
    env_config: dict = field(default_factory=dict)
    out_dir: str = "presample"
    k: int = 8
    min_correct: int = 7
    pef_samples: Union[str, int] = "refine"
    full_data: bool = False
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(seed=0))
    prompts_per_chunk: int = 64
    engine: str = DEFAULT_ENGINE
    engine_kwargs: dict = field(default_factory=dict)
    dtype: str = "float32"
    num_gpus_per_env_runner: float = 0

    def __post_init__(self):
        if isinstance(self.sampling, dict):
            self.sampling = SamplingParams(**self.sampling)
        if isinstance(self.sampling, SamplingParams) and self.sampling.seed is None:
            self.sampling = replace(self.sampling, seed=0)

    def problem(self) -> Optional[str]:
        """The first broken rule of the stage's own fields (``k``, ``min_correct`` and
        ``prompts_per_chunk`` ints >= 1, ``full_data`` a bool, ``min_correct <= k``,
        ``pef_samples``, ``sampling.n`` 1), or None; each message states the value, the rule and
        the fix."""
        problem = first_violation(self, PRESAMPLE_RULES)
        if problem is not None:
            return problem
        if self.min_correct > self.k:
            return f"min_correct={self.min_correct} must be <= k={self.k} (paper: 7 of 8)."
        if not isinstance(self.sampling, SamplingParams) or self.sampling.n != 1:
            return (f"sampling={self.sampling!r} is invalid: it must be a SamplingParams with n=1 (the stage draws "
                    f"k={self.k} samples per prompt); set k instead of sampling.n.")
        return pef_samples_problem(self.pef_samples)

    def validate(self) -> None:
        """Raises ValueError for a broken rule (:meth:`problem`) or a run without model or env."""
        problem = self.problem()
        if problem is None and not (self.model_name and self.env):
            problem = f"model_name={self.model_name!r}, env={self.env!r}: a pre-sampling run needs both."
        if problem is not None:
            raise ValueError(problem)


#: The rules of :class:`PresampleConfig`'s own numeric and bool fields (``rules.py``).
PRESAMPLE_RULES = (
    NumberRule("k", integer=True, low=1, fix="paper: 8 samples per prompt"),
    NumberRule("min_correct", integer=True, low=1, fix="paper: 7 of 8"),
    NumberRule("prompts_per_chunk", integer=True, low=1, fix="e.g. 64"),
    BoolRule("full_data"),
)

#: The fields of :class:`PresampleConfig` that a ``DPHConfig`` takes from its training settings.
TRAINING_FIELDS = (
    "model_name", "env", "env_config", "sampling", "engine", "engine_kwargs", "dtype", "num_gpus_per_env_runner",
)

def pef_samples_problem(value: Any) -> Optional[str]:
    """The error for a ``pef_samples`` that is not ``"all"``, ``"refine"`` or an integer >= 1, else None."""
    if value in PEF_SAMPLES_CHOICES or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return (f"pef_samples={value!r} must be 'all' (every correct sample of the k: the paper's "
            "'8 of 8' recipe), 'refine' (one refinement sample, §4.1) or an integer n >= 1 "
            "(at most n correct samples per prompt).")


def _task_row(task) -> dict[str, Any]:
    """A task in the original DPH-RL / verl layout (database paths made relative again)."""
    gt = task.ground_truth
    if isinstance(gt, dict):
        gt = {k: v for k, v in gt.items() if k != "db_path"}
    return {
        "id": str(task.id),
        "data_source": task.data_source,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in task.messages],
        "reward_model": {"style": "rule", "ground_truth": gt},
    }


def _db_root(tasks) -> Optional[str]:
    gt = tasks[0].ground_truth
    if isinstance(gt, dict) and "db_path" in gt and "db_id" in gt:
        return gt["db_path"][: -len(gt["db_id"])].rstrip("/") or "/"
    return None


def _write_parquet(table: pa.Table, path: pathlib.Path, metadata: dict[str, str]) -> None:
    """Writes ``table`` with ``metadata`` to ``path`` atomically (``files.atomic_path``), its
    checksum file (``<path>.sha256``) just before the file itself."""
    meta = {**(table.schema.metadata or {}), **{k.encode(): str(v).encode() for k, v in metadata.items()}}
    with atomic_path(path) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp)
        write_checksum(path, sha256_of(tmp))


def read_presampled(path: str | os.PathLike) -> bytes:
    """The bytes of a pre-sampled file (``d_pef.parquet``, ``d_exp.parquet``), checked against the
    checksum written beside it (``files.read_verified``): every reader, in the driver, the
    learners and the env runners, goes through here, so a corrupted, truncated or missing file is
    refused, never trained on.

    Raises:
        PefFileError: the file is missing, or its bytes are not those written (or it has no
            checksum file); the message names the file and the fix.
    """
    path = pathlib.Path(path)
    fix = (f"delete {path} and {checksum_path(path).name} beside it, and the next run (or `rllib presample` "
           f"--out {path.parent}) pre-samples the folder again")
    try:
        return read_verified(path)
    except FileNotFoundError:
        raise PefFileError(f"pre-sampled file {path} does not exist (deleted or moved after pre-sampling?): "
                           f"DPH cannot train without it; {fix}.") from None
    except ChecksumError as e:
        raise PefFileError(f"pre-sampled file {e}; it is not trained on. {fix[0].upper()}{fix[1:]}.") from None


def read_presampled_table(path: str | os.PathLike, columns: Optional[list[str]] = None) -> pa.Table:
    """The table of a pre-sampled parquet file, read from its checked bytes (:func:`read_presampled`)."""
    try:
        return pq.read_table(pa.BufferReader(read_presampled(path)), columns=columns)
    except (pa.ArrowInvalid, OSError) as e:  # checked bytes that pyarrow cannot read: not a pre-sampling file
        raise PefFileError(f"{path} is not a readable parquet file ({e}); give a file of `rllib presample`.") from None


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``rllib_dph.*`` schema metadata of a pre-sampling parquet file (prefix stripped)."""
    meta = pq.read_schema(path).metadata or {}
    return {
        k.decode()[len(META_PREFIX) :]: v.decode()
        for k, v in meta.items()
        if k.decode().startswith(META_PREFIX)
    }


def chat_template_sha(tokenizer) -> str:
    """16 hex characters of sha256 over the tokenizer's chat template, "none" without one."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return "none"
    return hashlib.sha256(str(template).encode()).hexdigest()[:16]


@contextlib.contextmanager
def presample_lock(out_dir: str | os.PathLike):
    """Holds an exclusive lock on ``out_dir`` (created) for one pre-sampling run at a time.

    A second process asking for the same directory waits until the first has finished, then
    finds its files (:func:`presample_once` checks them inside the lock); ``files.file_lock``
    times out with an error naming the lock and its holder.
    """
    with file_lock(pathlib.Path(out_dir) / LOCK_FILE, what="a pre-sampling run"):
        yield


def run_identity(config: PresampleConfig, fingerprint: str, tasks) -> dict[str, Any]:
    """What a pre-sampling directory's files depend on: the model, the prompts and the sampling.

    Args:
        config: The run.
        fingerprint: The policy model's fingerprint (``hub.model_fingerprint``).
        tasks: The env's tasks (``rllib_dph.envs.base.Task``); their ``content_json`` is hashed.
    """
    digest = hashlib.sha256()
    for task in tasks:
        digest.update(task.content_json().encode())
    return {"model_fingerprint": fingerprint, "data_sha256": digest.hexdigest()[:16], **identity_settings(config)}


def identity_settings(config: PresampleConfig) -> dict[str, Any]:
    """The selection and sampling settings that decide what a pre-sampling directory holds, beside
    the model and the data (:func:`run_identity`; ``preflight`` reads the same to refuse sweeps
    whose trials would share a directory while differing in one of them)."""
    settings = {name: getattr(config, name) for name in SELECTION_SETTINGS}
    settings["seed"], settings["prompts_per_chunk"] = config.sampling.seed, config.prompts_per_chunk
    return {**settings, **{key: getattr(config.sampling, name) for key, name in SAMPLING_SETTINGS.items()}}


def sample_key(config: PresampleConfig, identity: dict[str, Any]) -> str:
    """16 hex characters naming what stage 1's k samples per prompt are drawn from: ``identity``
    (:func:`run_identity`) without :data:`CHOICE_SETTINGS`, plus the env, the engine, their
    settings and the dtype."""
    drawn = {key: value for key, value in identity.items() if key not in CHOICE_SETTINGS}
    drawn.update(env=config.env, env_config=config.env_config, engine=config.engine,
                 engine_kwargs=config.engine_kwargs, dtype=config.dtype)
    return hashlib.sha256(json.dumps(drawn, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _share(source: pathlib.Path, dest: pathlib.Path) -> None:
    """Puts ``source`` at ``dest`` (absent): a hard link, or an atomic copy across file systems."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except FileExistsError:
        pass  # another process shared the same part (the same draws) first
    except OSError:
        write_bytes_atomic(dest, source.read_bytes())


def read_identity(out_dir: str | os.PathLike) -> Optional[dict[str, Any]]:
    """The identity a directory's files were made for, or None (none recorded)."""
    path = pathlib.Path(out_dir) / IDENTITY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def set_aside_stale(out_dir: str | os.PathLike, identity: dict[str, Any]) -> Optional[pathlib.Path]:
    """Moves the files of ``out_dir`` to ``out_dir/stale/<n>/`` unless they were made for ``identity``.

    A directory made by another model (e.g. a rebuilt tiny model), from other prompts or with
    other sampling settings would otherwise be resumed from, or its D_pef file used, as if it
    belonged to this run. Nothing is deleted; a warning names what changed and where the files went.

    Returns:
        The folder the files were moved to, or None when nothing was moved.
    """
    out = pathlib.Path(out_dir)
    files = [p for p in out.iterdir() if p.name not in (LOCK_FILE, STALE_DIR)] if out.is_dir() else []
    old = read_identity(out)
    if not files or old == identity:
        return None
    if old is None:
        changed = f"it has no {IDENTITY_FILE} (made by an older rllib_dph or by hand)"
    else:
        changed = ", ".join(f"{k} {old.get(k)!r} -> {v!r}" for k, v in identity.items() if old.get(k) != v)
    number = len(list((out / STALE_DIR).glob("*"))) if (out / STALE_DIR).is_dir() else 0
    dest = out / STALE_DIR / f"{number:03d}"
    dest.mkdir(parents=True)
    for path in files:
        path.rename(dest / path.name)
    warnings.warn(f"pre-sampling: {out} was made for another run ({changed}); its files were moved to {dest} "
                  "and pre-sampling runs again.", stacklevel=2)
    return dest


class Presampler:
    """Runs the pre-sampling stage with one rollout engine and one env.

    ``engine`` and ``env`` default to the config's; an ``env`` given must be the one the config
    names (as :func:`presample_once` builds it). With an ``engine`` given, stage 1's samples are
    neither taken from nor kept in the shared folder (:func:`sample_key` cannot name its draws).
    """

    def __init__(self, config: PresampleConfig, *, engine=None, env=None, fingerprint: Optional[str] = None):
        config.validate()
        self.config = config
        self.env = env if env is not None else make_env(config.env, dict(config.env_config))
        self.engine = engine if engine is not None else build_engine(config)
        self.tokenizer = self.engine.tokenizer
        self.out = pathlib.Path(config.out_dir)
        # The model's fingerprint hashes every weight file; a caller that has it passes it in.
        self.fingerprint = fingerprint or model_fingerprint(resolve_model(config.model_name))
        self.identity = run_identity(config, self.fingerprint, self.env.tasks)
        self.shared = None if engine is not None else home() / SHARED_SAMPLES_DIR / sample_key(config, self.identity)

    def _part(self, stage: str, chunk: int) -> pathlib.Path:
        """The part file of chunk ``chunk`` of ``stage``."""
        return self.out / "parts" / f"{stage}-{chunk:05d}.parquet"

    def _stage(self, stage: str, indices: list[int], n: int, seed: int, progress: bool) -> pa.Table:
        """Samples ``n`` completions per prompt → (index, pass_count, its correct samples).

        Chunk c of ``indices`` is sampled with seed ``seed + c`` and its rows written to
        ``parts/<stage>-<c>.parquet``; chunks whose part file exists are read back instead. The
        ``"sample"`` stage's parts are also taken from and kept in :attr:`shared` (when not None).

        Args:
            stage: ``"sample"`` (k samples per prompt) or ``"refine"`` (one per D_pef candidate).
            indices: Task indices, in order.
            n: Samples per prompt.
            seed: Seed of chunk 0.
            progress: Show a progress bar over the prompts on stderr, as evaluation does
                (advancing a chunk at a time; off when stderr is not a terminal or there are
                no prompts).
        """
        from tqdm.auto import tqdm

        c = self.config
        parts = []
        desc = f"pre-sampling k={n}" if stage == "sample" else "refinement"
        params = replace(c.sampling, n=n, seed=seed)
        total = -(-len(indices) // c.prompts_per_chunk)
        shared = stage == "sample" and self.shared is not None
        for local in (self._part(stage, chunk) for chunk in range(total)) if shared else ():
            if not local.exists() and (self.shared / local.name).exists():
                _share(self.shared / local.name, local)
        chunks = rollout_chunks(self.engine, self.env, indices, params, chunk_size=c.prompts_per_chunk,
                                skip=lambda chunk: self._part(stage, chunk).exists())
        # disable=None: tqdm's "off unless stderr is a terminal".
        with tqdm(total=len(indices), desc=desc, unit="prompt", disable=None if progress and indices else True) as bar:
            for chunk, chunk_indices, result in chunks:
                path = self._part(stage, chunk)
                if result is not None:
                    rows = []
                    for group in result.groups:
                        pairs = enumerate(zip(group.completions, group.correct))
                        correct = [(j, comp) for j, (comp, ok) in pairs if ok]
                        rows.append(
                            {
                                "index": group.index,
                                "pass_count": len(correct),
                                "sample_indices": [j for j, _ in correct],
                                "responses": [comp.token_ids.tolist() for _, comp in correct],
                                "ref_logps": [comp.logprobs.tolist() for _, comp in correct],
                            }
                        )
                    _write_parquet(_parts_table(rows), path, {})
                    if shared:
                        _share(path, self.shared / path.name)
                parts.append(pq.read_table(path))
                bar.update(len(chunk_indices))
        return pa.concat_tables(parts) if parts else _parts_table([])

    def _reference_responses(self, progress: bool) -> tuple[dict[int, int], list[int], dict[int, list[dict]]]:
        """Stages 1-3: pass counts of every prompt, the D_pef candidates, and the reference
        trajectories (``sample_index``, ``response_ids``, ``ref_logp``) of each prompt that stays
        in D_pef, as ``pef_samples`` says."""
        c = self.config
        sampled = self._stage("sample", list(range(len(self.env.tasks))), c.k, c.sampling.seed, progress).to_pylist()
        pass_count = {r["index"]: r["pass_count"] for r in sampled}
        candidates = sorted(i for i, n in pass_count.items() if n >= c.min_correct)
        if c.pef_samples == "refine":
            refine_seed = c.sampling.seed + 1_000_003
            refined = {r["index"]: r for r in self._stage("refine", candidates, 1, refine_seed, progress).to_pylist()}
            reference = {i: _trajectories(refined[i], first_index=c.k) for i in candidates if refined[i]["responses"]}
        else:
            by_index = {r["index"]: r for r in sampled}
            most = None if c.pef_samples == "all" else c.pef_samples
            reference = {i: _trajectories(by_index[i])[:most] for i in candidates}
        return pass_count, candidates, reference

    def _metadata(self) -> dict[str, Any]:
        """The schema metadata of both parquet files (see the module docstring)."""
        c = self.config
        metadata = {
            META_PREFIX + "model_fingerprint": self.fingerprint,
            META_PREFIX + "model_name": c.model_name,
            **{META_PREFIX + key: getattr(c.sampling, name) for key, name in SAMPLING_SETTINGS.items()},
            META_PREFIX + "chat_template_sha": chat_template_sha(self.tokenizer),
            META_PREFIX + "k": c.k,
            META_PREFIX + "min_correct": c.min_correct,
            META_PREFIX + "pef_samples": c.pef_samples,
            META_PREFIX + "full_data": c.full_data,
            META_PREFIX + "schema_version": SCHEMA_VERSION,
        }
        db_root = _db_root(self.env.tasks)
        if db_root is not None:
            metadata[META_PREFIX + "db_root"] = db_root
        return metadata

    def run(self, *, progress: bool = True) -> dict[str, Any]:
        """Runs (or resumes) the stage; writes the output files and returns the summary.

        Files in ``out_dir`` made for another run (:func:`run_identity`) are set aside first
        (:func:`set_aside_stale`), so a resumed run only reuses parts of this very run.
        """
        c = self.config
        tasks = self.env.tasks
        if progress:
            print(f"rllib: pre-sampling {len(tasks)} prompts, k={c.k} samples each, into {self.out} (later runs with "
                  "the same model, data and sampling reuse its files)", file=sys.stderr, flush=True)
        set_aside_stale(self.out, self.identity)
        for name in (PEF_FILE, EXP_FILE, SUMMARY_FILE, IDENTITY_FILE):  # a killed run's temporary files
            remove_leftovers(self.out / name)
            remove_leftovers(checksum_path(self.out / name))
        (self.out / "parts").mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.out / IDENTITY_FILE, self.identity)
        pass_count, candidates, reference = self._reference_responses(progress)
        pef = sorted(reference)
        exp = [i for i in range(len(tasks)) if c.full_data or i not in reference]
        pef_rows = []
        for i in pef:
            prompt = {**_task_row(tasks[i]), "prompt_ids": encode_task(self.tokenizer, tasks[i])}
            for ref in reference[i]:
                pef_rows.append(
                    {
                        **prompt,
                        "response_ids": ref["response_ids"],
                        "ref_logp": ref["ref_logp"],
                        "response": self.tokenizer.decode(ref["response_ids"], skip_special_tokens=True),
                        "pass_count": pass_count[i],
                        "sample_index": ref["sample_index"],
                    }
                )
        metadata = self._metadata()
        _write_parquet(pa.Table.from_pylist([_task_row(tasks[i]) for i in exp]), self.out / EXP_FILE, metadata)

        counts = np.array([pass_count[i] for i in range(len(tasks))])
        summary = {
            "num_prompts": len(tasks),
            "num_pef": len(pef),
            "num_pef_trajectories": len(pef_rows),
            "num_exp": len(exp),
            "num_candidates": len(candidates),
            "num_refinement_failures": len(candidates) - len(pef),
            "pass_at_1": float(counts.mean() / c.k),
            "pass_at_k": float((counts > 0).mean()),
            "pass_count_histogram": np.bincount(counts, minlength=c.k + 1).tolist(),
            "db_root": metadata.get(META_PREFIX + "db_root"),
            "model_fingerprint": self.fingerprint,
            "config": asdict(c),
        }
        write_json_atomic(self.out / SUMMARY_FILE, summary)
        # Last: a D_pef file marks a complete directory (presample_once reuses it as such).
        _write_parquet(_pef_table(pef_rows), self.out / PEF_FILE, metadata)
        return summary


def _trajectories(row: dict, first_index: int = 0) -> list[dict]:
    """The correct samples of one part-file row as reference trajectories; ``sample_index``
    counts from ``first_index`` (``k`` for the refinement stage, so it never repeats a first-stage index)."""
    return [{"sample_index": first_index + j, "response_ids": ids, "ref_logp": logp}
            for j, ids, logp in zip(row["sample_indices"], row["responses"], row["ref_logps"])]


def _parts_table(rows: list[dict]) -> pa.Table:
    schema = pa.schema(
        [
            ("index", pa.int64()),
            ("pass_count", pa.int32()),
            ("sample_indices", pa.list_(pa.int32())),
            ("responses", pa.list_(pa.list_(pa.int32()))),
            ("ref_logps", pa.list_(pa.list_(pa.float32()))),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _pef_table(rows: list[dict]) -> pa.Table:
    table = pa.Table.from_pylist(rows)
    casts = {
        "prompt_ids": pa.list_(pa.int32()),
        "response_ids": pa.list_(pa.int32()),
        "ref_logp": pa.list_(pa.float32()),
        "pass_count": pa.int32(),
        "sample_index": pa.int32(),
    }
    if not rows:
        return table
    for name, typ in casts.items():
        table = table.set_column(table.schema.get_field_index(name), name, table[name].cast(typ))
    return table


def presample_once(config: PresampleConfig, *, progress: bool = True, fingerprint: Optional[str] = None) -> bool:
    """Runs pre-sampling into ``config.out_dir`` unless it holds this run's files; True if it ran.

    The directory is reused when its D_pef and D_exp files and their checksum files exist and its
    :data:`IDENTITY_FILE` matches this run (same model fingerprint, prompts and sampling
    settings); otherwise files made for another run are set aside (:func:`set_aside_stale`) and
    the stage runs (a deleted file of this run is made again from the kept sample parts). Holds :func:`presample_lock` while it
    looks and samples, so when several processes (Tune trials of one sweep) need the same
    directory, one samples and the others wait, then reuse its files. ``fingerprint``: the
    policy model's (``hub.model_fingerprint``), when the caller has computed it already.
    """
    with presample_lock(config.out_dir):
        env = make_env(config.env, dict(config.env_config))
        fingerprint = fingerprint or model_fingerprint(resolve_model(config.model_name))
        identity = run_identity(config, fingerprint, env.tasks)
        out = pathlib.Path(config.out_dir)
        complete = all(path.exists() for name in (PEF_FILE, EXP_FILE) for path in (out / name, checksum_path(out / name)))
        if complete and read_identity(config.out_dir) == identity:
            return False
        Presampler(config, env=env, fingerprint=fingerprint).run(progress=progress)
        return True


def presample(config: PresampleConfig, *, progress: bool = True, engine=None, env=None) -> dict[str, Any]:
    """Runs the pre-sampling stage under :func:`presample_lock`; see the module docstring for
    the output files."""
    with presample_lock(config.out_dir):
        return Presampler(config, engine=engine, env=env).run(progress=progress)


class PefFileError(ValueError):
    """A D_pef file training cannot use: missing, empty, or made for another model or sampling."""


def prepare_pef(config, *, progress: bool = True) -> tuple[str, Optional[str]]:
    """Makes ``config``'s pre-sampled files ready for training; the one place that decides about them.

    ``rllib train``'s preparation and ``DPH.setup`` call it (``DPHConfig.validate`` only checks
    fields). With the embedded stage's ``out_dir`` (``config.presample``, run as
    ``config.presample_config()``), :func:`presample_once` reuses its files or (re)samples them.
    Then :func:`check_pef_file` checks the D_pef file (``pef_path``, or ``out_dir``'s own)
    against the policy's fingerprint (``hub.model_fingerprint``: hashed once, then kept).

    Args:
        config: A ``DPHConfig``: ``model_name``, ``presample_config()``, ``resolved_pef_path``,
            ``resolved_exp_path`` and ``sampling_params()`` (:data:`SAMPLING_SETTINGS`).
        progress: Show progress bars while sampling.

    Returns:
        The D_pef and D_exp paths (``resolved_pef_path``, ``resolved_exp_path``).

    Raises:
        PefFileError: The D_pef file is missing or empty, or was made for another model or with
            other sampling settings (the message names both values and the fix); the D_pef or the
            D_exp file is missing or not the bytes written (:func:`read_presampled`).
    """
    fingerprint = model_fingerprint(resolve_model(config.model_name))
    stage = config.presample_config()
    if stage.out_dir:  # one pre-sampling per directory, also for parallel trials
        presample_once(stage, progress=progress, fingerprint=fingerprint)
    check_pef_file(config.resolved_pef_path, config, fingerprint=fingerprint)
    if config.resolved_exp_path is not None:
        read_presampled(config.resolved_exp_path)  # DPH samples D_exp: a missing file is no whole split
    return config.resolved_pef_path, config.resolved_exp_path


def check_pef_file(path: str, config, *, fingerprint: str) -> None:
    """Refuses a D_pef file (:class:`PefFileError`) that is missing or empty, or whose folder's
    :data:`IDENTITY_FILE` is missing, predates ``pef_samples`` (schema 2), or names other
    selection settings (:data:`SELECTION_SETTINGS`) or sampling settings than ``config``'s or a
    model fingerprint other than ``fingerprint`` (the policy's); see :func:`prepare_pef`."""
    if not os.path.exists(path):
        raise PefFileError(f"pef_path={path!r} does not exist; run `rllib presample` first or fix the path.")
    if pq.read_metadata(pa.BufferReader(read_presampled(path))).num_rows == 0:
        raise PefFileError(
            f"D_pef file {path!r} is empty: no training prompt reached {config.presample.min_correct} correct "
            "samples; lower presample's min_correct or use a stronger base model."
        )
    folder = os.path.dirname(path) or "."
    fix = (
        f"re-run pre-sampling with this config (delete {folder} or run `rllib presample` with the training "
        "settings), or set the config to the file's values"
    )
    identity = read_identity(folder)
    if identity is None:
        raise PefFileError(f"D_pef file {path!r} has no {IDENTITY_FILE} beside it (made by an older rllib_dph "
                           f"or moved without it), so what made it is unknown; {fix}.")
    if "pef_samples" not in identity:
        raise PefFileError(f"D_pef file {path!r} was made before pre-sampling recorded pef_samples (one reference "
                           f"trajectory per prompt, schema 2); it is not read as if made by today's rules; {fix}.")
    differ = {name: identity.get(name) for name in SELECTION_SETTINGS
              if identity.get(name) != getattr(config.presample, name)}
    if differ:
        raise PefFileError(
            f"D_pef file {path!r} was selected with "
            + ", ".join(f"{name}={value!r}" for name, value in differ.items())
            + ", but this config's presample has "
            + ", ".join(f"{name}={getattr(config.presample, name)!r}" for name in differ)
            + ": the file holds another D_pef than the config names (the prompts and trajectories of the paper's "
            f"Table 4 recipe) and is not read as the config's; set .dph(presample={differ!r}) to train on it as "
            f"it is, or re-run pre-sampling with this config (delete {folder} or run `rllib presample` with the "
            "training settings)."
        )
    sampling = config.sampling_params()
    for name, field_name in SAMPLING_SETTINGS.items():
        value = getattr(sampling, field_name)
        if name not in identity or float(identity[name]) != float(value):
            raise PefFileError(
                f"D_pef file {path!r} was sampled with {name}={identity.get(name)}, but this config has "
                f"{name}={value}: its stored reference log-probs belong to another distribution; {fix}."
            )
    if identity.get("model_fingerprint") != fingerprint:
        raise PefFileError(
            f"D_pef file {path!r} was made by a model with fingerprint {identity.get('model_fingerprint')}, but "
            f"the policy {config.model_name!r} has fingerprint {fingerprint}: its stored reference log-probs "
            "belong to another model or tokenizer. Re-run pre-sampling with this model."
        )
