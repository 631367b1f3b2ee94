"""How good and how diverse is a base policy: accuracy, pass@k and solution styles on the bundled suites.

Measures a model (by default the bundled ``tiny-sql-math``, built on first use) the same way its
build does: greedy accuracy on sql_synth/test, sql_synth/test_cross and math_synth/test; pass@1
and pass@n (unbiased, temperature 1.0) and the style of every sample on sql_synth/test. Prints
one table; no thresholds.

    python research/base_model.py                                  # tiny-sql-math
    python research/base_model.py --model path/to/model --samples 16
"""

import argparse
import time

import torch

from rllib_dph.models.build.prepare import prepare_model
from rllib_dph.models.hub import load_causal_lm, load_tokenizer, model_fingerprint
from rllib_dph.evaluation.base_model import evaluate_base_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-sql-math", help="bundled name, local path or HF id")
    parser.add_argument("--samples", type=int, default=8, help="samples per SQL test prompt (pass@n)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    prepare_model(args.model)  # a bundled model not built yet is built first (one line on stderr)
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model, dtype="float32")
    start = time.perf_counter()
    metrics = evaluate_base_policy(
        model, tokenizer, samples=args.samples, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    seconds = time.perf_counter() - start

    print(f"\nmodel {args.model} (fingerprint {model_fingerprint(args.model)}), "
          f"{torch.get_num_threads()} threads, evaluated in {seconds:.0f}s")
    print(f"{'metric':36s} value")
    for key, value in metrics.items():
        if isinstance(value, dict):
            value = "  ".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, float):
            value = f"{value:.3f}"
        print(f"{key:36s} {value}")


if __name__ == "__main__":
    main()
