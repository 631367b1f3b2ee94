"""What DPH-RL's D_pef holds of the two-approach families' approaches (ties, NULL), and what each method keeps of
them where both are right (the reading is in docs/results/pef-styles.md, "Result").

Three measurements, any of them:

1. ``--presample DIR``: what a pre-sampling folder's D_pef holds of each approach (``order_limit``,
   ``extremum``; ``count_star``, ``count_col`` where it pre-sampled the NULL family) under Table 4's thresholds (8, 7, 6 and 5 of 8 correct, and "full data": 1 of 8),
   read from its ``parts/`` (every prompt's correct samples, kept whatever the threshold).
2. ``--runs [DIR ...]``: on the two-approach questions of ``sql_synth/test`` (the ordinary
   highest/lowest questions: nothing ties, so both approaches are right), the share of samples
   written ``extremum`` and pass@k per approach, for the base model and every run
   (``runs/<method>_seed<s>/checkpoint``) of ``research/reproduce_dph.py`` output folders, with
   each method's paired difference to GRPO over prompts and seeds (``--runs`` alone: the base
   model only). Evaluations are cached as
   ``<out>/<folder>/<run>.json`` and reused.
3. ``--styles DIR``: from a ``research/reproduce_dph.py`` folder's in-domain evaluations
   (``eval_in-domain.json`` of ``base/`` and of each run; ``--split nulls`` / ``ties``: that family's
   evaluations and its approaches), each SQL style's share of the samples
   per method, next to the style shares of D_pef's trajectories (``--presample``), with each
   method's paired difference to GRPO and to DAPO per style (intervals over prompts and seeds).

Example::

    python research/pef_coverage.py --presample ~/.cache/rllib_dph/presample/sql_tiny_k8_all_seed0 \\
        --runs research/out/reproduce_dph_ties_v2 --out research/out/pef_coverage
"""

from __future__ import annotations

import argparse
import glob
import json
import pathlib
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reproduce_dph import CLUSTERS, cell, split_tasks  # noqa: E402  research/reproduce_dph.py ("mean [interval]" in %)

#: Table 4's D_pef thresholds (correct samples of k = 8); 1 is "full data".
THRESHOLDS = (8, 7, 6, 5, 1)
SPLIT = "sql_synth/test"


def two_approach_tasks(split: str) -> list:
    """The tasks of ``split`` that both approaches answer: the ordinary questions of
    ``sql_suite.EXTREMUM_TEMPLATES`` (their ``meta["approaches"]``), none whose top ties."""
    from rllib_dph.envs.suites import load_split

    return [t for t in load_split(split) if t.meta.get("approaches") and not t.meta.get("ties")]


def family_sources() -> dict[tuple[str, ...], str]:
    """Each two-approach family's approaches (fragile, robust) -> the data source whose style names
    they are (``suites.STYLES``): ties, then NULL."""
    from rllib_dph.envs.suites import SQL_NULLS_SOURCE, SQL_TIES_SOURCE, STYLES

    return {STYLES[source]: source for source in (SQL_TIES_SOURCE, SQL_NULLS_SOURCE)}


def pef_composition(folder: pathlib.Path, thresholds=THRESHOLDS) -> list[dict]:
    """Per threshold m: D_pef's prompts and trajectories (every correct sample of prompts with
    >= m of k correct, ``pef_samples="all"``), and how many of the two-approach prompts'
    trajectories are written with each approach of their family (ties: ``order_limit``,
    ``extremum``; NULL: ``count_star``, ``count_col``), decoded with the tokenizer of the model
    that ``folder``'s ``summary.json`` names."""
    import pandas as pd

    from rllib_dph.envs.data.loaders import load_tasks
    from rllib_dph.envs.suites import style_of
    from rllib_dph.models.hub import load_tokenizer

    parts = sorted(glob.glob(str(folder / "parts" / "sample-*.parquet")))
    if not parts:
        raise FileNotFoundError(f"{folder}: no parts/sample-*.parquet; pass a finished pre-sampling folder.")
    config = json.loads((folder / "summary.json").read_text())["config"]
    tasks = load_tasks(config["env_config"]["data"], task="sql")
    tokenizer = load_tokenizer(config["model_name"])
    sources = family_sources()
    rows = []
    for part in parts:
        for r in pd.read_parquet(part).itertuples():
            approaches = tuple(tasks[r.index].meta.get("approaches") or ())
            texts = [tokenizer.decode(list(ids), skip_special_tokens=True) for ids in r.responses] if approaches else []
            written = [style_of(sources[approaches], text) for text in texts]
            rows.append({"pass_count": r.pass_count, "trajectories": len(r.responses), "two": bool(approaches),
                         **{a: written.count(a) for a in approaches}})
    df = pd.DataFrame(rows).fillna(0)
    names = [a for family in sources for a in family if a in df]
    out = []
    for m in thresholds:
        pef = df[df.pass_count >= m]
        two = pef[pef.two]
        out.append({"min_correct": m, "prompts": len(pef), "trajectories": int(pef.trajectories.sum()),
                    "two_approach_prompts": len(two), "two_approach_trajectories": int(two.trajectories.sum()),
                    **{a: int(two[a].sum()) for a in names}})
    return out


def composition_table(rows: list[dict], folder: pathlib.Path) -> str:
    families = family_sources()
    approaches = [a for family in families for a in family if a in rows[0]]
    robust = [robust for _, robust in families if robust in rows[0]]
    lines = [f"D_pef of {folder} (`pef_samples=\"all\"`) under each threshold:", "",
             "| min_correct of 8 | D_pef prompts | trajectories | two-approach prompts | their trajectories | "
             + " | ".join(f"`{a}`" for a in approaches) + " | "
             + " | ".join(f"`{a}` share of all trajectories" for a in robust) + " |",
             "|" + " --- |" * (5 + len(approaches) + len(robust))]
    for r in rows:
        shares = [f"{100 * r[a] / max(1, r['trajectories']):.2f} %" for a in robust]
        lines.append(f"| {r['min_correct']} | {r['prompts']} | {r['trajectories']} | {r['two_approach_prompts']} | "
                     f"{r['two_approach_trajectories']} | " + " | ".join(str(r[a]) for a in approaches) + " | "
                     + " | ".join(shares) + " |")
    return "\n".join(lines)


def evaluate(policy: str, tasks: list, path: pathlib.Path, args):
    """``policy``'s evaluation on ``tasks`` with approach names as styles (cached at ``path``)."""
    from rllib_dph.engines.base import SamplingParams
    from rllib_dph.envs.registry import make_env
    from rllib_dph.evaluation import EvalResult, EvalSettings, evaluate_engine
    from rllib_dph.evaluation.runner import load_engine

    if path.exists():
        return EvalResult.from_json(path)
    settings = EvalSettings(sampling=SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens,
                                                    seed=0), style_suite="sql_synth_ties", greedy=False)
    env = make_env("rllib_dph/SQL-v0", {"data": tasks})
    try:
        result = evaluate_engine(load_engine(policy), env, settings)
    finally:
        env.close()
    result.policy, result.env_id = policy, "rllib_dph/SQL-v0"
    result.env_config = {"data": f"{SPLIT}, its {len(tasks)} two-approach questions"}
    path.parent.mkdir(parents=True, exist_ok=True)
    result.to_json(path)
    return result


def accuracy(results: list, approach: str) -> str:
    """``"12 of 230 (5.2 %)"``: how many of the samples written with ``approach`` are right, pooled
    over prompts and seeds."""
    written = right = 0
    for result in results:
        for record in result.records:
            hits = [c for s, c in zip(record.styles, record.correct) if s == approach]
            written, right = written + len(hits), right + sum(hits)
    return f"{right} of {written} ({100 * right / max(1, written):.1f} %)"


def style_shares(results: list, styles) -> np.ndarray:
    """(K, S, P) share of each prompt's samples written in each of ``styles``, per seed."""
    return np.array([[r.style_matrix([style])[:, 0] / r.n for r in results] for style in styles])


def d_pef_style_shares(folder: pathlib.Path, styles) -> dict[str, float]:
    """Each SQL style's share of the trajectories of ``folder``'s ``d_pef.parquet``."""
    import pyarrow.parquet as pq

    from rllib_dph.envs.suites import style_of

    named = [style_of("sql_synth", text) for text in pq.read_table(folder / "d_pef.parquet").column("response").to_pylist()]
    return {style: named.count(style) / len(named) for style in styles}


#: The style names of each split ``--styles`` reads: the SQL styles in-domain, each family's approaches on its split.
SPLIT_STYLES = {"in-domain": "sql_synth", "ties": "sql_synth_ties", "nulls": "sql_synth_nulls"}


def split_results(folder: pathlib.Path, split: str = "in-domain") -> dict[str, list]:
    """Policy label ("base", then each method) -> its seeds' evaluations of ``split`` (a key of
    :data:`SPLIT_STYLES`, as ``research/reproduce_dph.py`` names its files)."""
    from rllib_dph.evaluation import EvalResult

    results = {"base": [EvalResult.from_json(folder / "base" / f"eval_{split}.json")]}
    for path in sorted((folder / "runs").glob(f"*_seed*/eval_{split}.json")):
        results.setdefault(path.parent.name.rsplit("_seed", 1)[0], []).append(EvalResult.from_json(path))
    return results


def style_tables(results: dict[str, list], d_pef: dict[str, float] | None, suite: str = "sql_synth",
                 clusters: list | None = None) -> str:
    """Each style's share of the samples per policy (and of D_pef's trajectories) and the style
    entropy over the styles of ``suite`` (``STYLES[suite]``: the five SQL styles, or a family's
    two approaches; bits, of the counts pooled over prompts and seeds), then each method's paired
    difference of both to GRPO and to DAPO, with 95 % intervals, and the seed-level statistics of
    each method's style entropy − GRPO's (:func:`entropy_seed_table`; ``clusters``: each prompt's
    question cluster, in the evaluations' prompt order, for its cluster bootstrap)."""
    from rllib_dph.envs.suites import STYLES
    from rllib_dph.evaluation import style_entropy
    from rllib_dph.evaluation.intervals import (entropy_interval, format_interval, paired_difference_interval,
                                                paired_entropy_difference_interval)

    styles = STYLES[suite]
    shares = {name: style_shares(seeds, styles) for name, seeds in results.items()}
    counts = {name: np.array([r.style_matrix(styles) for r in seeds]) for name, seeds in results.items()}  # (S, P, K)

    head = " | ".join(f"`{s}`" for s in styles) + " | style entropy (bits)"
    out = [f"| policy | seeds | {head} |", "|" + " --- |" * (3 + len(styles))]
    if d_pef is not None:
        out.append("| D_pef's trajectories | — | " + " | ".join(f"{100 * d_pef[s]:.1f}" for s in styles) + " | |")
    for name, share in shares.items():
        cells = [cell(v)[0] for v in share]
        cells.append(format_interval(pooled_entropy(counts[name], styles), entropy_interval(counts[name], style_entropy, styles), digits=2))
        out.append(f"| {name} | {len(results[name])} | " + " | ".join(cells) + " |")
    for ref in (r for r in ("GRPO", "DAPO") if r in shares):
        out += ["", f"Paired differences to {ref}, points of share and bits:", "", f"| policy | {head} |",
                "|" + " --- |" * (2 + len(styles))]
        for name, share in shares.items():
            if name in ("base", ref):
                continue
            cells = [format_interval(float(a.mean() - b.mean()), paired_difference_interval(a, b), scale=100)
                     for a, b in zip(share, shares[ref])]
            ci = paired_entropy_difference_interval(counts[name], counts[ref], style_entropy, styles)
            cells.append(format_interval(pooled_entropy(counts[name], styles) - pooled_entropy(counts[ref], styles), ci, digits=2))
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    seeds = entropy_seed_table(counts, styles, clusters)
    return "\n".join(out + (["", seeds] if seeds else []))


def pooled_entropy(counts: np.ndarray, styles) -> float:
    """The style entropy (bits) of (S, P, K) style counts pooled over seeds and prompts."""
    from rllib_dph.evaluation import style_entropy

    return style_entropy(dict(zip(styles, counts.sum(axis=(0, 1)))))


def entropy_seed_table(counts: dict[str, np.ndarray], styles, clusters: list | None = None) -> str:
    """A Markdown table, for every method with 2 or more seeds against GRPO (when GRPO has 2 or
    more), of the style entropy − GRPO's (bits): each seed's entropy (its counts pooled over
    prompts), the paired bootstrap over prompts and seeds, Welch's t interval and the exact
    permutation p-value with the seed as the unit, and with ``clusters`` the bootstrap over
    question clusters and seeds. ``counts``: policy -> (S, P, K) style counts. Empty when there is
    nothing to compare."""
    from rllib_dph.evaluation import style_entropy
    from rllib_dph.evaluation.intervals import (cluster_paired_entropy_difference_interval, format_interval,
                                                paired_entropy_difference_interval, permutation_p_value,
                                                welch_interval)

    grpo = counts.get("GRPO")
    if grpo is None or len(grpo) < 2:
        return ""

    def per_seed(c: np.ndarray) -> np.ndarray:  # (S, 1): one entropy per seed, as the seed statistics' (S, P)
        return np.array([[pooled_entropy(seed[None], styles)] for seed in c])

    lines = ["Seed-level statistics of the style entropy against GRPO (bits): each seed's entropy, the bootstrap "
             "over prompts and seeds, Welch's t interval and the exact permutation p-value with the seed as the "
             "unit" + (f", and the bootstrap over the {len(set(map(repr, clusters)))} question clusters and seeds"
                       if clusters is not None else "") + ":", "",
             "| method | method's seeds | GRPO's seeds | bootstrap (prompts, seeds) | Welch t (seeds) | "
             "permutation p (seeds) | cluster bootstrap |", "| --- | --- | --- | --- | --- | --- | --- |"]
    b, grpo_entropy = per_seed(grpo), pooled_entropy(grpo, styles)
    for name, c in counts.items():
        if name in ("base", "GRPO") or len(c) < 2:
            continue
        a, diff = per_seed(c), pooled_entropy(c, styles) - grpo_entropy
        fmt = lambda ci: format_interval(diff, ci, digits=2)  # noqa: E731
        cluster = "—" if clusters is None else fmt(
            cluster_paired_entropy_difference_interval(c, grpo, clusters, style_entropy, styles))
        lines.append(f"| {name} | {', '.join(f'{x + 0.0:.2f}' for x in a[:, 0])} | {', '.join(f'{x + 0.0:.2f}' for x in b[:, 0])} | "
                     f"{fmt(paired_entropy_difference_interval(c, grpo, style_entropy, styles))} | "
                     f"{format_interval(float(a.mean() - b.mean()), welch_interval(a, b), digits=2)} | "
                     f"{permutation_p_value(a, b):.2f} | {cluster} |")
    return "\n".join(lines) if len(lines) > 4 else ""


def method_runs(folders: list[pathlib.Path]) -> dict[str, list[pathlib.Path]]:
    """Method label -> its seeds' checkpoints; labels of folders after the first carry the folder's name."""
    runs: dict[str, list[pathlib.Path]] = {}
    for i, folder in enumerate(folders):
        for ckpt in sorted((folder / "runs").glob("*_seed*/checkpoint")):
            method = ckpt.parent.name.rsplit("_seed", 1)[0]
            runs.setdefault(method if i == 0 else f"{method} ({folder.name})", []).append(ckpt)
    return runs


def approach_table(base, results: dict[str, list], k: int) -> str:
    """Per method: the ``extremum`` share of samples, its paired difference to GRPO, and pass@k
    overall and per approach, each with a 95 % interval over prompts and seeds."""
    from rllib_dph.evaluation.intervals import format_interval, paired_difference_interval

    grpo = style_shares(results["GRPO"], ["extremum"])[0] if "GRPO" in results else None
    lines = [f"| policy | seeds | `extremum` share of samples | − GRPO | `extremum` samples right | "
             f"`order_limit` samples right | pass@{k} | pass@{k} `extremum` | pass@{k} `order_limit` |",
             "|" + " --- |" * 9]
    for name, seeds in {"base": [base], **results}.items():
        share = style_shares(seeds, ["extremum"])[0]
        diff = "—" if grpo is None or name in ("base", "GRPO") else format_interval(
            float(share.mean() - grpo.mean()), paired_difference_interval(share, grpo), scale=100)
        per = {m: np.array([r.per_prompt(m) for r in seeds]) for m in
               (f"pass@{k}", f"pass@{k}/extremum", f"pass@{k}/order_limit")}
        right = " | ".join(accuracy(seeds, a) for a in ("extremum", "order_limit"))
        lines.append(f"| {name} | {len(seeds)} | {cell(share)[0]} | {diff} | {right} | "
                     + " | ".join(cell(v)[0] for v in per.values()) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presample", type=pathlib.Path, help="a finished pre-sampling folder (its parts/)")
    parser.add_argument("--runs", type=pathlib.Path, nargs="*",
                        help="research/reproduce_dph.py output folders (given with none: the base model alone)")
    parser.add_argument("--styles", type=pathlib.Path, help="a research/reproduce_dph.py folder with evaluations of --split")
    parser.add_argument("--split", choices=list(SPLIT_STYLES), default="in-domain",
                        help="the split --styles reads: in-domain (the SQL styles) or a family's (its approaches)")
    parser.add_argument("--base", default="tiny-sql-math", help="the base model the runs started from")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "research/out/pef_coverage")
    args = parser.parse_args()
    from rllib_dph.envs.suites import STYLES

    text = []
    if args.presample:
        text.append(composition_table(pef_composition(args.presample), args.presample))
    if args.runs is not None:
        tasks = two_approach_tasks(SPLIT)
        base = evaluate(args.base, tasks, args.out / "base.json", args)
        results = {method: [evaluate(str(c), tasks, args.out / c.parents[2].name / f"{c.parent.name}.json", args)
                            for c in ckpts] for method, ckpts in method_runs(args.runs).items()}
        text.append(f"The {len(tasks)} two-approach questions of {SPLIT} (nothing ties; both approaches right), "
                    f"n = {args.n} at temperature 1, {args.max_new_tokens} tokens; in %, 95 % intervals over "
                    f"prompts and seeds:\n\n" + approach_table(base, results, args.n))
    if args.styles:
        suite = SPLIT_STYLES[args.split]
        d_pef = d_pef_style_shares(args.presample, STYLES[suite]) if args.presample and args.split == "in-domain" else None
        results = split_results(args.styles, args.split)
        tasks = {t.id: t for t in split_tasks(args.split)}
        clusters = [CLUSTERS[args.split](tasks[r.task_id]) for r in results["base"][0].records]
        text.append(f"Styles on the {args.split} split ({args.split} evaluations of {args.styles}), share of samples "
                    "in %, 95 % intervals over prompts and seeds:\n\n" + style_tables(results, d_pef, suite, clusters))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n\n".join(text) + "\n")
    print("\n\n".join(text))


if __name__ == "__main__":
    main()
