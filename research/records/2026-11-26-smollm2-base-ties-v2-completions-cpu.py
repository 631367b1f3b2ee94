# What SmolLM2's right answers on test_ties (family version 2) are: the base model of the GPU
# run on the ties family (docs/results/smollm2-ties.md, "Base model and GRPO on one H100"), sampled again on CPU in fp32 with the texts
# kept (the GPU evaluations keep no completions). It ran from the repository root at commit 1ecde13
# (as docs/collapse_runs/2026-11-26-smollm2-base-ties-v2-completions-cpu.py, its place then); here:
# python research/records/2026-11-26-smollm2-base-ties-v2-completions-cpu.py
import collections, gzip, json, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # research/: reproduce_dph
from rllib_dph.engines.base import SamplingParams
from rllib_dph.evaluation import EvalSettings, evaluate_policy
from rllib_dph.models.hub import resolve_model
from rllib_dph.envs.suites import load_split
from reproduce_dph import SPLITS

env_id, env_config = SPLITS["ties"]
tasks = {t.id: t for t in load_split("sql_synth/test_ties")}
s = EvalSettings(sampling=SamplingParams(n=16, temperature=1.0, max_new_tokens=96, seed=0), limit=100,
                 keep_completions=True, greedy=False)
t = time.time()
r = evaluate_policy(str(resolve_model("smollm2-135m-sft")), env_id, env_config, s, name="base")
print("seconds", round(time.time() - t))
counts = collections.Counter()
right = []
for rec in r.records:
    for ok, style, text in zip(rec.correct, rec.styles, rec.completions):
        counts[(style, ok)] += 1
        if ok:
            question = tasks[rec.task_id].messages[0]["content"].split("Question: ")[1].split("\n")[0]
            right.append({"task_id": rec.task_id, "style": style, "question": question, "completion": text})
            print("----", rec.task_id, style, question)
            print(text.strip()[:300])
for k, v in sorted(counts.items(), key=str):
    print(k, v)
record = __import__("pathlib").Path(__file__).resolve()
with gzip.open(record.parents[2] / "docs/collapse_runs" / record.name.replace(".py", ".json.gz"), "wt") as f:
    json.dump({"counts": {f"{k[0]} {'right' if k[1] else 'wrong'}": v for k, v in counts.items()},
               "right": right}, f, indent=1)
