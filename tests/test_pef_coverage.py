"""research/pef_coverage.py: what D_pef holds of the ties family's two approaches under each threshold."""

import pyarrow.parquet as pq
import pytest

from rllib_dph.envs.suites import style_of
from rllib_dph.evaluation.results import EvalResult, PromptRecord
from rllib_dph.algorithms.dph.presample import PresampleConfig, presample


@pytest.fixture(scope="module")
def coverage(load_script):
    return load_script("research/pef_coverage")


@pytest.fixture(scope="module")
def presampled(tmp_path_factory):
    """The shipped tiny model's pre-sampling of 40 training prompts (4 of them two-approach ones)."""
    out = tmp_path_factory.mktemp("pef_coverage")
    config = PresampleConfig(model_name="tiny-sql-math", env="rllib_dph/SQL-v0",
                             env_config={"data": "sql_synth/train[:40]"}, out_dir=str(out), k=4, min_correct=3,
                             pef_samples="all", sampling={"max_new_tokens": 96}, prompts_per_chunk=20)
    presample(config, progress=False)
    return out


def test_the_folders_own_threshold_gives_its_d_pef_exactly(coverage, presampled):
    rows = coverage.pef_composition(presampled, thresholds=(4, 3, 2, 1))
    pef = pq.read_table(presampled / "d_pef.parquet").to_pylist()
    two = {t.id for t in coverage.two_approach_tasks("sql_synth/train")}
    at_3 = next(r for r in rows if r["min_correct"] == 3)
    assert at_3["prompts"] == len({r["id"] for r in pef}) and at_3["trajectories"] == len(pef)
    approaches = [style_of("sql_synth_ties", r["response"]) for r in pef if r["id"] in two]
    assert at_3["two_approach_trajectories"] == len(approaches)
    assert (at_3["extremum"], at_3["order_limit"]) == (approaches.count("extremum"), approaches.count("order_limit"))
    # A lower threshold keeps every prompt a higher one keeps, and more.
    for higher, lower in zip(rows, rows[1:]):
        assert all(lower[key] >= higher[key] for key in ("prompts", "trajectories", "two_approach_trajectories"))
    assert rows[-1]["two_approach_prompts"] > 0


def test_shares_and_accuracies_count_each_approachs_samples(coverage):
    records = [
        PromptRecord(task_id="a", index=0, correct=[True, False, True, False],
                     answers=[None] * 4, styles=["extremum", "extremum", "order_limit", "other"], num_truncated=0),
        PromptRecord(task_id="b", index=1, correct=[False, False, True, True],
                     answers=[None] * 4, styles=["order_limit", "order_limit", "order_limit", "extremum"],
                     num_truncated=0),
    ]
    result = EvalResult(records=records, n=4, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0, ks=[1, 2, 4])
    assert coverage.style_shares([result], ["extremum"]).tolist() == [[[0.5, 0.25]]]
    assert coverage.accuracy([result], "extremum") == "2 of 3 (66.7 %)"
    assert coverage.accuracy([result], "order_limit") == "2 of 4 (50.0 %)"


def test_a_folder_without_parts_is_refused_with_its_name(coverage, tmp_path):
    (tmp_path / "summary.json").write_text('{"config": {"env_config": {"data": "sql_synth/train[:4]"}}}')
    with pytest.raises(FileNotFoundError, match="no parts/sample"):
        coverage.pef_composition(tmp_path)


def _result(styles_per_prompt):
    records = [PromptRecord(task_id=str(i), index=i, correct=[True] * len(s), answers=[None] * len(s), styles=s,
                            num_truncated=0) for i, s in enumerate(styles_per_prompt)]
    return EvalResult(records=records, n=4, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0, ks=[1, 2, 4])


def test_style_tables_give_each_styles_share_and_its_paired_difference(coverage):
    plain = _result([["plain"] * 4, ["plain", "plain", "cte", "cte"]])  # plain 75 %, cte 25 %
    mixed = _result([["plain", "alias", "cte", "negated"], ["subquery"] * 4])
    shares = coverage.style_shares([plain, mixed], ("plain", "cte"))  # (K, S, P)
    assert shares.tolist() == [[[1.0, 0.5], [0.25, 0.0]], [[0.0, 0.5], [0.25, 0.0]]]
    d_pef = {"plain": 0.4, "alias": 0.1, "subquery": 0.2, "cte": 0.2, "negated": 0.1}
    lines = coverage.style_tables({"base": [mixed], "GRPO": [plain, plain], "DAPO": [mixed], "DPH-JS": [plain]},
                                  d_pef).splitlines()
    assert "| D_pef's trajectories | — | 40.0 | 10.0 | 20.0 | 20.0 | 10.0 | |" in lines
    dph_vs_grpo = lines[lines.index("Paired differences to GRPO, points of share and bits:") + 5]
    assert dph_vs_grpo.startswith("| DPH-JS | 0.0 [0.0, 0.0] | 0.0 [0.0, 0.0] |")
    assert dph_vs_grpo.endswith("| 0.00 [0.00, 0.00] |")  # the same samples: the same entropy
    dph_vs_dapo = lines[lines.index("Paired differences to DAPO, points of share and bits:") + 5]
    assert dph_vs_dapo.startswith("| DPH-JS | 62.5 [")  # plain: 75 % against 12.5 %
    # DPH-JS pools plain 6 and cte 2 (0.81 bits); DAPO every style, subquery 4 of 8 (2.0 bits).
    assert "| -1.19 [" in dph_vs_dapo


def test_the_null_familys_approaches_are_counted_in_d_pef(coverage, tmp_path):
    """Parts of a NULL-family pre-sampling (written here: the shipped model was not trained on the
    family): its trajectories are named ``count_star`` / ``count_col`` per threshold."""
    import json

    import pandas as pd

    from rllib_dph.envs.suites import load_split
    from rllib_dph.models.hub import load_tokenizer

    tokenizer = load_tokenizer("tiny-sql-math")
    tasks = load_split("sql_synth/train_nulls")[:3]

    def ids(task, approach):
        return tokenizer(f"```sql\n{task.meta['approaches'][approach]['plain']}\n```")["input_ids"]

    written = [["count_star"] * 4, ["count_star", "count_col"], ["count_col"]]  # pass counts 4, 2, 1 of 4
    rows = [{"index": i, "pass_count": len(w), "sample_indices": list(range(len(w))),
             "responses": [ids(tasks[i], a) for a in w], "ref_logps": [[0.0] * len(ids(tasks[i], a)) for a in w]}
            for i, w in enumerate(written)]
    (tmp_path / "parts").mkdir()
    pd.DataFrame(rows).to_parquet(tmp_path / "parts" / "sample-00000.parquet")
    (tmp_path / "summary.json").write_text(json.dumps(
        {"config": {"model_name": "tiny-sql-math", "env_config": {"data": "sql_synth/train_nulls[:3]"}}}))
    by_threshold = {r["min_correct"]: r for r in coverage.pef_composition(tmp_path, thresholds=(4, 2, 1))}
    assert (by_threshold[4]["count_star"], by_threshold[4]["count_col"]) == (4, 0)
    assert (by_threshold[2]["count_star"], by_threshold[2]["count_col"]) == (5, 1)
    assert (by_threshold[1]["count_star"], by_threshold[1]["count_col"]) == (5, 2)
    assert by_threshold[1]["trajectories"] == by_threshold[1]["two_approach_trajectories"] == 7
    table = coverage.composition_table(list(by_threshold.values()), tmp_path)
    assert "`count_col` share of all trajectories" in table and "| 1 | 3 | 7 | 3 | 7 | 5 | 2 | 28.57 % |" in table


def test_style_tables_of_a_family_split_use_its_approaches(coverage):
    star = _result([["count_star"] * 4, ["count_star", "count_star", "count_col", "count_col"]])
    col = _result([["count_col"] * 4, ["count_col"] * 4])
    lines = coverage.style_tables({"base": [col], "GRPO": [star]}, None, "sql_synth_nulls").splitlines()
    assert lines[0] == "| policy | seeds | `count_star` | `count_col` | style entropy (bits) |"
    assert lines[3].startswith("| GRPO | 1 | 75.0 [")


def test_the_seed_table_gives_each_seeds_entropy_welch_permutation_and_clusters(coverage):
    import math

    plain = _result([["plain"] * 4, ["plain"] * 4])  # 0 bits
    half = _result([["plain", "plain", "cte", "cte"], ["plain", "cte", "plain", "cte"]])  # 1 bit
    quarter = _result([["plain", "plain", "plain", "cte"], ["plain", "plain", "plain", "cte"]])  # 0.81 bits
    lines = coverage.style_tables({"base": [half], "GRPO": [plain, plain], "DPH-JS": [half, quarter]}, None,
                                  clusters=["db1", "db1"]).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Seed-level statistics of the style entropy"))
    assert "the 1 question clusters" in lines[head]
    row = lines[head + 4].split(" | ")
    assert row[0] == "| DPH-JS" and row[1] == "1.00, 0.81" and row[2] == "0.00, 0.00"
    pooled = -(10 / 16) * math.log2(10 / 16) - (6 / 16) * math.log2(6 / 16)  # plain 10, cte 6 of the 16 samples
    assert row[3].startswith(f"{pooled:.2f} [")
    assert row[4].startswith("0.91 [")  # Welch: the mean of the seeds' entropies, 0.91 - 0
    assert row[5] == "0.33"  # 2 seeds a side: the smallest p is 2 / C(4, 2)
    assert row[6].startswith(f"{pooled:.2f} [")
    # One seed of a method, or of GRPO: no seed table.
    assert "Seed-level" not in coverage.style_tables({"base": [half], "GRPO": [plain], "DPH-JS": [half, half]}, None)
