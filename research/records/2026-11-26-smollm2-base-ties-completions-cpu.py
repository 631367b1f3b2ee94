# A record of the run on 2026-11-26 (docs/collapse.md): it ran at commit 4e73353, on version 1 of
# the ties family, with `every_candidate_ties` (removed when version 2 left those questions out).
# To rerun it: `git worktree add /tmp/v1 4e73353` and run it from that tree's root, with the
# sys.path line below naming the folder that held reproduce_dph.py at that commit.
import collections, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # research/: reproduce_dph
from rllib_dph.engines.base import SamplingParams
from rllib_dph.evaluation import EvalSettings, evaluate_policy
from rllib_dph.models.hub import resolve_model
from rllib_dph.envs.suites import every_candidate_ties, load_split
from reproduce_dph import SPLITS
env_id, env_config = SPLITS["ties"]
tasks = {t.id: t for t in load_split("sql_synth/test_ties")}
s = EvalSettings(sampling=SamplingParams(n=16, temperature=1.0, max_new_tokens=96, seed=0), limit=100,
                 keep_completions=True, greedy=False)
t = time.time()
r = evaluate_policy(str(resolve_model("smollm2-135m-sft")), env_id, env_config, s, name="base")
print("seconds", round(time.time() - t))
r.to_json("ties_ranked.json")
counts = collections.Counter()
for rec in r.records:
    ranked = not every_candidate_ties(tasks[rec.task_id])
    for ok, style, text in zip(rec.correct, rec.styles, rec.completions):
        counts[(ranked, style, ok)] += 1
        if ok and ranked:
            print("----", rec.task_id, style, tasks[rec.task_id].messages[0]["content"].split("Question: ")[1].split("\n")[0])
            print(text.strip()[:300])
for k, v in sorted(counts.items(), key=str): print(k, v)
