# Exploratory (docs/results/smollm2-ties.md, "Base model and GRPO on one H100"): does a longer warm start make SmolLM2 write the ties
# family's robust approach (`extremum`, `= (SELECT MAX(...))`) as a minority? The shipped warm start
# (smollm2-135m-sft: 120 steps x 8 examples, 12 `extremum` answers against 66 `LIMIT 1` among its
# SQL examples) writes it in 3 of 1,600 samples on test_ties. This builds the same recipe with
# 600 steps (4,800 examples: 47 `extremum` against 270 `LIMIT 1`, the same 15 % share) on CPU and
# samples it as the other scripts here do (first 100 test_ties prompts, n = 16, fp32), and the
# first 50 `test` prompts for its in-domain quality. Registered afterwards, with this spec, as
# `smollm2-135m-sft-600` (docs/models.md).
# It ran from the repository root at commit 74dcc19 (as docs/collapse_runs/, its place then; ~1 h on
# 2 cores); here: python research/records/2026-11-26-smollm2-sft600-ties-share-cpu.py
import collections, dataclasses, json, pathlib, sys, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # research/: reproduce_dph
from rllib_dph.engines.base import SamplingParams
from rllib_dph.evaluation import EvalSettings, evaluate_policy
from rllib_dph.models import catalog
from rllib_dph.models.build import warm_start
from rllib_dph.models.hub import resolve_model
from reproduce_dph import SPLITS

NAME, OUT = "smollm2-135m-sft-600", pathlib.Path("/tmp/smollm2-135m-sft-600")
catalog.WARM_STARTS[NAME] = dataclasses.replace(catalog.WARM_STARTS["smollm2-135m-sft"], sft_steps=600)
if not (OUT / catalog.BUILD_RECORD).is_file():
    record = warm_start.build_warm_start(NAME, OUT, base_dir=resolve_model("smollm2-135m-instruct"),
                                         checkpoint_dir="/tmp/smollm2-135m-sft-600-ckpt", progress=False)
    print("built", json.dumps(record["sft"])[:400], flush=True)
report = {}
for split, limit in (("ties", 100), ("in-domain", 50)):
    env_id, env_config = SPLITS[split]
    s = EvalSettings(sampling=SamplingParams(n=16, temperature=1.0, max_new_tokens=96, seed=0), limit=limit)
    t = time.time()
    r = evaluate_policy(str(OUT), env_id, env_config, s, name=NAME)
    keep = ("pass@1", "pass@16", "greedy_accuracy", "style_counts", "style_entropy_bits",
            "pass@16/extremum", "pass@16/order_limit", "pass@16/other")
    report[split] = {k: r.summary()[k] for k in keep if k in r.summary()}
    counts = collections.Counter((st, ok) for rec in r.records for st, ok in zip(rec.styles, rec.correct))
    report[split]["right_by_approach"] = {st: n for (st, ok), n in counts.items() if ok}
    print(split, round(time.time() - t), "s", json.dumps(report[split]), flush=True)
record = pathlib.Path(__file__).resolve()
(record.parents[2] / "docs/collapse_runs" / record.name.replace(".py", ".json")).write_text(json.dumps(report, indent=1) + "\n")
