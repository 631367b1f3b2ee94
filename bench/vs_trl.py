"""Seconds per GRPO training step: ours against TRL's `GRPOTrainer`, on the same work.

Both sides train the same local model folder (default: the bundled `tiny-sql-math`; `--model`
takes another name or folder) on the same prompts in the same order, step for step:
`--prompts-per-step` prompts (8) of `sql_synth/train`, drawn once with `--seed`, times
`--group-size` completions (8) of at most `--max-response-length` new tokens (64) at temperature
1.0 (top-p 1, no top-k); fp32; one optimizer step per batch (one forward/backward over all rows,
no gradient accumulation, no epochs); no reference model; no vLLM; token-mean loss with the PPO
clip 0.2; advantages normalised by the group's std; Adam without weight decay, grad-norm clip
1.0, constant `--lr` (3e-4); no gradient checkpointing; `torch.set_num_threads(--threads)` on
both sides. The reward on both sides is `rllib_dph.envs.sql.verify_sql` (what `SQLEnv` calls) on
the completion decoded with `skip_special_tokens=True`.

Ours: `tuned_examples/grpo/sql_tiny_grpo.py` with those overrides (`num_env_runners=0`,
`num_learners=0`) in this process; a step is one `algo.train()`. TRL: `Trainer.train()` in its
own virtual environment (`--venv`, default `$XDG_CACHE_HOME/rllib_dph/trl-venv`), a subprocess
driven over a pipe and paused by a callback after each round; its data set holds the same chat
messages (the script checks that both sides get the same prompt token ids), read in order; a
step is the time between two `on_step_end` callbacks.

`--warmup` steps per side (not counted), then `--rounds` rounds of `--steps` steps per side,
alternated, one side at a time. Printed: the median seconds per step of each side, ours/TRL and
the median of the per-round ratios, the medians of the phases (generation, reward, update,
other), mean completion length and mean reward. Results: docs/results/costs.md, "Against TRL".

Set up the TRL environment once (`python -m venv`, then torch pinned to this environment's CPU
build so that pip never pulls CUDA, then trl==1.13.0 datasets==5.0.1 accelerate==1.15.0 and this
environment's transformers and gymnasium):

    python bench/vs_trl.py --setup

Then:

    python bench/vs_trl.py --threads 1
    python bench/vs_trl.py --threads 2
    python bench/vs_trl.py --threads 1 --rounds 2 --steps 2      # quicker
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
#: Where ``--setup`` makes the TRL environment unless ``--venv`` names another folder.
DEFAULT_VENV = str(pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
                   / "rllib_dph" / "trl-venv")
TRL_VERSION = "1.13.0"
DATASETS_VERSION = "5.0.1"
#: TRL needs accelerate; pinned here because the launching environment need not have it.
ACCELERATE_VERSION = "1.15.0"
#: Lines of the TRL worker's stdout that carry a message start with this.
TAG = "@@vs_trl "

# The TRL side. Runs under the venv's python with argv[1] = a JSON file of settings and tasks.
WORKER = r'''
import json, os, sys, time
from collections import defaultdict

cfg = json.load(open(sys.argv[1]))
import torch
torch.set_num_threads(cfg["threads"])
sys.path.append(cfg["repo"])  # appended: only `rllib_dph.envs` (our verifier) is imported from it
from rllib_dph.envs.sql import verify_sql
import datasets, transformers, trl
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOConfig, GRPOTrainer

TAG = cfg["tag"]

def send(kind, **data):
    sys.stdout.write(TAG + json.dumps({"kind": kind, **data}) + "\n")
    sys.stdout.flush()

def wait_for_go():
    line = sys.stdin.readline()
    if line.strip() != "go":
        sys.exit(0)

last_rows = []

def sql_reward(prompts, completions, gold_sql, db_path, cmp_method, row, **_):
    last_rows[:] = [r for i, r in enumerate(row) if i == 0 or row[i - 1] != r]  # the step's prompts
    out = []
    for completion, gold, db, method in zip(completions, gold_sql, db_path, cmp_method):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        out.append(float(verify_sql(text, gold, db, cmp_method=method, timeout_s=cfg["sql_timeout_s"]).reward))
    return out

tasks = cfg["tasks"]
tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
ids = tokenizer.apply_chat_template([t["messages"] for t in tasks], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"]
same_prompts = sum(list(a) == list(t["prompt_ids"]) for a, t in zip(ids, tasks))

dataset = datasets.Dataset.from_list([
    {"prompt": t["messages"], "gold_sql": t["gold_sql"], "db_path": t["db_path"], "cmp_method": t["cmp_method"],
     "row": i}
    for i, t in enumerate(tasks)
])
P, G = cfg["prompts_per_step"], cfg["group_size"]
args = GRPOConfig(
    output_dir=cfg["output_dir"],
    per_device_train_batch_size=P * G,   # one forward/backward over all rows of a step
    gradient_accumulation_steps=1,
    num_generations=G,
    num_iterations=1,
    max_steps=cfg["total_steps"],
    max_completion_length=cfg["max_response_length"],
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    beta=0.0,
    epsilon=0.2,
    loss_type="dapo",                  # token mean over the whole batch (our "token-mean")
    scale_rewards="group",
    learning_rate=cfg["lr"],
    lr_scheduler_type="constant",
    weight_decay=0.0,
    max_grad_norm=1.0,
    gradient_checkpointing=False,
    bf16=False,
    fp16=False,
    use_cpu=True,
    use_vllm=False,
    shuffle_dataset=False,
    seed=cfg["seed"],
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    disable_tqdm=True,
    dataloader_num_workers=0,
)

phases = defaultdict(float)
marks = {}

def timed(name, fn):
    def wrapper(*a, **k):
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            phases[name] += time.perf_counter() - start
    return wrapper

class Pacer(TrainerCallback):
    def __init__(self):
        self.block = []
        self.t = None

    def on_train_begin(self, args, state, control, **kw):
        send("ready", same_prompts=same_prompts, num_prompts=len(tasks), threads=torch.get_num_threads(),
             versions={"trl": trl.__version__, "transformers": transformers.__version__,
                       "torch": torch.__version__, "datasets": datasets.__version__},
             optim=str(getattr(args.optim, "value", args.optim)),
             activation_checkpointing=bool(getattr(trainer.model, "is_gradient_checkpointing", False)),
             generation_config={k: v for k, v in trainer.generation_config.to_diff_dict().items()
                                if k != "transformers_version"})
        wait_for_go()
        phases.clear()
        self.t = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kw):
        marks["optimizer_done"] = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter()
        m = trainer._metrics["train"]
        clip_opt = marks["optimizer_done"] - marks["training_step_done"]
        update = phases["training_step"] - phases["gen_score"] + clip_opt
        self.block.append({
            "total": now - self.t,
            "generation": phases["generation"],
            "reward": phases["reward"],
            "update": update,
            "completion_length": m["completions/mean_length"][-1],
            "reward_mean": m["reward"][-1],
            "rows": list(last_rows),
        })
        phases.clear()
        if state.global_step in cfg["report_at"]:
            send("steps", steps=self.block)
            self.block = []
            if state.global_step < state.max_steps:
                wait_for_go()
        self.t = time.perf_counter()

trainer = GRPOTrainer(model=model, reward_funcs=sql_reward, args=args, train_dataset=dataset,
                      processing_class=tokenizer, callbacks=[Pacer()])
trainer.remove_callback(PrinterCallback)
trainer.remove_callback(ProgressCallback)
trainer._generate_single_turn = timed("generation", trainer._generate_single_turn)
trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
trainer._generate_and_score_completions = timed("gen_score", trainer._generate_and_score_completions)
_training_step = trainer.training_step

def training_step(*a, **k):
    start = time.perf_counter()
    out = _training_step(*a, **k)
    marks["training_step_done"] = time.perf_counter()
    phases["training_step"] += marks["training_step_done"] - start
    return out

trainer.training_step = training_step
trainer.train()
send("done")
'''


# --------------------------------------------------------------------------------------- setup
def pinned(name: str) -> str:
    """``name==<the version installed in this environment>``."""
    return f"{name}=={importlib.metadata.version(name)}"


def setup_commands(venv: str) -> list[list[str]]:
    """The commands of ``--setup``: versions are read from this environment only for rllib_dph's
    own requirements (torch, transformers, gymnasium)."""
    python = str(pathlib.Path(venv) / "bin" / "python")
    torch_pin = pinned("torch")
    return [
        [sys.executable, "-m", "venv", venv],
        [python, "-m", "pip", "install", torch_pin],
        [python, "-m", "pip", "install", f"trl=={TRL_VERSION}", f"datasets=={DATASETS_VERSION}",
         f"accelerate=={ACCELERATE_VERSION}", pinned("transformers"), pinned("gymnasium"), torch_pin],
    ]


def setup(venv: str) -> None:
    """Creates the TRL virtual environment and checks that it holds no CUDA packages."""
    for command in setup_commands(venv):
        print("+ " + " ".join(command), flush=True)
        subprocess.run(command, check=True)
    python = str(pathlib.Path(venv) / "bin" / "python")
    listing = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], check=True,
                             capture_output=True, text=True).stdout
    cuda = [line for line in listing.splitlines() if line.lower().startswith(("nvidia", "triton"))]
    if cuda:
        raise SystemExit(f"vs_trl: CUDA packages got into {venv}: {cuda}; remove the venv and retry.")
    subprocess.run([python, "-c", "import trl, transformers, torch; from trl import GRPOTrainer; "
                    "print('trl', trl.__version__, 'transformers', transformers.__version__, "
                    "'torch', torch.__version__)"], check=True)


# ------------------------------------------------------------------------------------ the TRL side
class TRLWorker:
    """The TRL subprocess: started at once, paced with ``go`` lines on its stdin."""

    def __init__(self, python: str, settings: dict, workdir: str, threads: int):
        path = pathlib.Path(workdir)
        (path / "settings.json").write_text(json.dumps(settings))
        (path / "worker.py").write_text(WORKER)
        self.log_path = path / "trl_stderr.log"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [python, str(path / "worker.py"), str(path / "settings.json")], cwd=workdir, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1,
        )

    def receive(self, kind: str) -> dict:
        """Reads the worker's stdout up to its next message, which must be of ``kind``."""
        for line in self.proc.stdout:
            if line.startswith(TAG):
                message = json.loads(line[len(TAG):])
                if message["kind"] != kind:
                    raise RuntimeError(f"TRL worker sent {message['kind']!r}, expected {kind!r}")
                return message
            self.log.write(line)
        self.proc.wait()
        self.log.flush()
        tail = self.log_path.read_text()[-4000:]
        raise RuntimeError(f"TRL worker exited with code {self.proc.returncode} before "
                           f"{kind!r}; the end of its log ({self.log_path}):\n{tail}")

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ------------------------------------------------------------------------------------ our side
def build_ours(args, model_dir: str, pool: list[int]):
    """Our GRPO algorithm with the benchmark's overrides; its env runner takes ``pool``'s
    prompts in order, ``prompts_per_step`` at a time (cycling)."""
    from rllib_dph.cli.experiments import load_tuned_example

    config, _ = load_tuned_example(args.example)
    config.update_from_dict({
        "model_name": model_dir,
        "prompts_per_step": args.prompts_per_step,
        "group_size": args.group_size,
        "max_response_length": args.max_response_length,
        "temperature": 1.0,
        "top_p": 1.0,
        "kl_coeff": 0.0,
        "num_env_runners": 0,
        "num_learners": 0,
        "lr": args.lr,
        "seed": args.seed,
    })
    algo = config.build_algo()
    runner = algo.env_runner
    runner.rows_taken = []  # positions in ``pool`` of the prompts of each call

    def next_prompts(num_prompts: int) -> list[int]:
        start = sum(len(rows) for rows in runner.rows_taken)
        rows = [(start + i) % len(pool) for i in range(num_prompts)]
        runner.rows_taken.append(rows)
        return [pool[r] for r in rows]

    runner._next_prompts = next_prompts
    return config, algo, runner


def our_step(algo, runner) -> dict:
    start = time.perf_counter()
    result = algo.train()
    total = time.perf_counter() - start
    runners, times = result["env_runners"], result["step_times"]
    return {
        "total": total,
        "generation": runners["generation_time_s"],
        "reward": runners["scoring_time_s"],
        "update": times["learner_update_s"],
        "completion_length": runners["response_length_mean"],
        "reward_mean": runners["reward_mean"],
        "rows": runner.rows_taken[-1],
    }


def cpu_snapshot() -> tuple[float, float, float]:
    """(CPU seconds the machine has been busy, CPU seconds of this process and all its live
    descendants (the TRL worker, Ray's processes) including their reaped children, wall clock).
    The difference of the first two between two snapshots is other processes' CPU time."""
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields)) / hz  # all but idle, iowait
    parents, times = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()  # fields from the state on
        parents[int(entry)] = int(rest[1])
        times[int(entry)] = sum(int(x) for x in rest[11:15]) / hz  # utime stime cutime cstime
    ours, tree = 0.0, {os.getpid()}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                changed = True
    ours = sum(times.get(pid, 0.0) for pid in tree)
    return busy, ours, time.perf_counter()


# --------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help="create the TRL venv (--venv) and exit")
    parser.add_argument("--venv", default=DEFAULT_VENV, help=f"the TRL virtual environment (default {DEFAULT_VENV})")
    parser.add_argument("--model", default="tiny-sql-math", help="bundled model name or HF model folder")
    parser.add_argument("--example", default=str(REPO / "tuned_examples/grpo/sql_tiny_grpo.py"))
    parser.add_argument("--data", default="sql_synth/train", help="SQL split the prompts come from")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-response-length", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=2, help="uncounted steps per side before the rounds")
    parser.add_argument("--rounds", type=int, default=5, help="A/B rounds (ours, then TRL)")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per side per round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.setup:
        setup(args.venv)
        return
    python = pathlib.Path(args.venv) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"vs_trl: no TRL environment at --venv {args.venv} (no {python}); make it with "
                         f"`python {sys.argv[0]} --setup --venv {args.venv}` first.")
    if args.warmup < 1 or args.rounds < 1 or args.steps < 1:
        raise SystemExit("vs_trl: --warmup, --rounds and --steps must be >= 1.")

    import torch

    torch.set_num_threads(args.threads)
    from rllib_dph.envs.data import load_tasks
    from rllib_dph.chat import encode_prompt
    from rllib_dph.models.hub import load_tokenizer
    from rllib_dph.models.build.prepare import prepare_model

    model_dir = str(pathlib.Path(prepare_model(args.model).location).resolve())
    if not pathlib.Path(model_dir).is_dir():
        raise SystemExit(f"vs_trl: {args.model!r} is not a local model folder ({model_dir}); "
                         "TRL and ours must load the same files.")

    # The prompts: one per (step, slot), no prompt twice while the data lasts.
    total_steps = args.warmup + args.rounds * args.steps
    tasks = load_tasks(args.data, task="sql")
    n = args.prompts_per_step * total_steps
    rng = np.random.default_rng(args.seed)
    pool = rng.choice(len(tasks), size=n, replace=n > len(tasks)).tolist()
    tokenizer = load_tokenizer(model_dir)
    worker_tasks = []
    for index in pool:
        task = tasks[index]
        truth = task.ground_truth
        messages = [dict(m) for m in task.messages]
        worker_tasks.append({
            "messages": messages,
            "prompt_ids": encode_prompt(tokenizer, messages),
            "gold_sql": truth["gold_sql"],
            "db_path": truth["db_path"],
            "cmp_method": truth["cmp_method"],
        })

    report_at = [args.warmup + r * args.steps for r in range(args.rounds + 1)]
    workdir = tempfile.mkdtemp(prefix="vs_trl_")
    settings = {
        "tag": TAG, "repo": str(REPO), "model": model_dir, "tasks": worker_tasks,
        "threads": args.threads, "prompts_per_step": args.prompts_per_step,
        "group_size": args.group_size, "max_response_length": args.max_response_length,
        "lr": args.lr, "seed": args.seed, "total_steps": total_steps, "report_at": report_at,
        "output_dir": str(pathlib.Path(workdir) / "trl_out"), "sql_timeout_s": 15.0,
    }
    trl = TRLWorker(str(python), settings, workdir, args.threads)  # starts while ours is built

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        config, algo, runner = build_ours(args, model_dir, pool)
        if any(runner.env.tasks[i].id != tasks[i].id for i in pool):
            raise RuntimeError("our env's task order differs from load_tasks'; prompts would differ")
        env = runner.env
        if (env.cmp_method, env.timeout_s, env.partial_credit, env.format_penalty) != (None, 15.0, False, 0.0):
            raise RuntimeError("our SQL env's reward settings differ from the TRL side's verify_sql call "
                               "(each task's cmp_method, timeout 15 s, no partial credit, no format penalty)")
        torch.set_num_threads(args.threads)
        ready = trl.receive("ready")

        ours_rounds, trl_rounds = [], []
        load = [cpu_snapshot()]
        ours_warmup = [our_step(algo, runner) for _ in range(args.warmup)]
        trl.go()
        trl_warmup = trl.receive("steps")["steps"]
        for r in range(args.rounds):
            ours_rounds.append([our_step(algo, runner) for _ in range(args.steps)])
            trl.go()
            trl_rounds.append(trl.receive("steps")["steps"])
            print(f"round {r + 1}/{args.rounds}: ours {np.median([s['total'] for s in ours_rounds[-1]]):.3f} s, "
                  f"TRL {np.median([s['total'] for s in trl_rounds[-1]]):.3f} s per step", flush=True)
        load.append(cpu_snapshot())
        trl.receive("done")
        ours_threads = torch.get_num_threads()
        algo.stop()
        same_steps = sum(a["rows"] == b["rows"] for a, b in zip(
            ours_warmup + sum(ours_rounds, []), trl_warmup + sum(trl_rounds, [])))
    finally:
        trl.close()
        ray.shutdown()

    report(args, config, model_dir, ready, ours_threads, ours_rounds, trl_rounds, load, same_steps)


def report(args, config, model_dir, ready, ours_threads, ours_rounds, trl_rounds, load, same_steps) -> None:
    import ray
    import torch

    rows = args.prompts_per_step * args.group_size
    versions = ready["versions"]
    print(f"\nGRPO step, ours vs TRL GRPOTrainer: {model_dir}")
    print(f"{args.prompts_per_step} prompts x {args.group_size} completions = {rows} rows, max "
          f"{args.max_response_length} new tokens, temperature 1.0, fp32, beta 0, lr {args.lr}; "
          f"torch threads: ours {ours_threads}, TRL {ready['threads']}")
    print(f"ours: torch {torch.__version__}, ray {ray.__version__}, transformers "
          f"{importlib.metadata.version('transformers')}; TRL {versions['trl']}: torch {versions['torch']}, "
          f"transformers {versions['transformers']}, optimizer {ready['optim']}")
    print(f"TRL generate(): {json.dumps(ready['generation_config'], sort_keys=True)}; activation "
          f"checkpointing {ready['activation_checkpointing']}")
    print(f"prompt token ids identical on both sides: {ready['same_prompts']}/{ready['num_prompts']}; steps "
          f"with the same prompts in the same order: {same_steps}/{args.warmup + args.rounds * args.steps}")
    (busy0, ours0, wall0), (busy1, ours1, wall1) = load
    foreign = max(0.0, (busy1 - busy0) - (ours1 - ours0))
    print(f"during the measured steps ({wall1 - wall0:.0f} s): machine busy {busy1 - busy0:.1f} CPU-s, this "
          f"benchmark's processes {ours1 - ours0:.1f} CPU-s, others {foreign:.1f} CPU-s "
          f"({100 * foreign / max(wall1 - wall0, 1e-9):.0f}% of one core; near 0 on an otherwise idle machine)")
    if foreign > 0.05 * (wall1 - wall0):
        print("WARNING: other processes competed for the CPU during the measured steps; these timings "
              "are not clean; rerun on an idle machine.")
    print(f"{args.warmup} warm-up step(s) per side, then {args.rounds} rounds x {args.steps} steps per side, "
          f"alternated ours, TRL")
    ours = [s for block in ours_rounds for s in block]
    theirs = [s for block in trl_rounds for s in block]
    for steps in (ours, theirs):
        for s in steps:
            s["other"] = s["total"] - s["generation"] - s["reward"] - s["update"]
    print(f"\n{'median per step':<28}{'ours':>10}{'TRL':>10}{'ours/TRL':>10}")
    for key, label in (("total", "step (s)"), ("generation", "  generation (s)"),
                       ("reward", "  reward (s)"), ("update", "  update (s)"), ("other", "  other (s)"),
                       ("completion_length", "completion length (tokens)"), ("reward_mean", "reward")):
        a = float(np.median([s[key] for s in ours]))
        b = float(np.median([s[key] for s in theirs]))
        ratio = f"{a / b:>10.2f}" if b else f"{'-':>10}"
        print(f"{label:<28}{a:>10.3f}{b:>10.3f}{ratio}")
    per_round = [np.median([s["total"] for s in a]) / np.median([s["total"] for s in b])
                 for a, b in zip(ours_rounds, trl_rounds)]
    a = float(np.median([s["total"] for s in ours]))
    b = float(np.median([s["total"] for s in theirs]))
    print(f"\nmedian step: ours {a:.3f} s, TRL {b:.3f} s, ours/TRL = {a / b:.2f} "
          f"(per-round ratios {', '.join(f'{x:.2f}' for x in per_round)}; "
          f"{len(ours)} steps per side)")


if __name__ == "__main__":
    main()
