"""Re-measures the shipped tiny-sql-math's ties metrics the way its build does (evaluate_base_policy's
ties part: 8 samples, 160 tokens, seed 0, one thread) and prints them as JSON.

Run on 2026-11-26 at commit 4e73353 (ties family version 1: reproduced the record exactly) and at
090efaa (version 2: the numbers now in the record), from the repository root with PYTHONPATH=$PWD.
"""
import functools, json, sys, time
import torch
torch.set_num_threads(1)
from rllib_dph.engines.hf import HFEngine
from rllib_dph.evaluation import base_model
from rllib_dph.models.catalog import SHIPPED_DIR
from rllib_dph.models.hub import load_causal_lm, load_tokenizer
path = str(SHIPPED_DIR / "tiny-sql-math")
model, tok = load_causal_lm(path, dtype="float32").eval(), load_tokenizer(path)
engine = HFEngine(model, tok, device=model.device)
run = functools.partial(base_model._rollout_split, engine, max_new_tokens=160, seed=0, progress=False)
t = time.time()
m = base_model._ties_metrics(run, 8)
m["seconds"] = round(time.time() - t, 1)
print(json.dumps(m))
