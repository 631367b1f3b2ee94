"""The reproduction's reading of a paired difference: higher, lower, no difference, cannot tell."""

import pytest


@pytest.fixture(scope="module")
def reproduce(load_script):
    return load_script("research/reproduce_dph")


@pytest.mark.parametrize("kind, ci, expected", [
    ("kept", (-0.02, 0.05), "holds"),  # no loss beyond the 3-point margin
    ("kept", (-0.03, 0.04), "holds"),  # at the margin exactly (not -3.0000000000000004)
    ("kept", (-0.08, -0.04), "does not hold"),
    ("kept", (-0.06, 0.02), "cannot tell"),
    ("above", (0.01, 0.05), "holds"),
    ("above", (-0.08, -0.04), "does not hold (lower)"),
    ("above", (-0.02, 0.025), "does not hold (no difference beyond ±3)"),
    ("above", (-0.02, 0.06), "cannot tell"),
])
def test_verdict_reads_the_interval_against_zero_and_the_margin(reproduce, kind, ci, expected):
    assert reproduce.verdict({"mean": sum(ci) / 2, "ci95": list(ci)}, margin=3.0, scale=100, kind=kind) == expected


def test_verdict_refuses_an_unknown_kind(reproduce):
    with pytest.raises(ValueError, match="kind='better'"):
        reproduce.verdict({"mean": 0.0, "ci95": [0.0, 0.0]}, margin=3.0, scale=100, kind="better")


def test_claims_table_has_a_row_per_claim_and_a_column_per_dph_variant(reproduce):
    diff = {"mean": 0.01, "ci95": [-0.01, 0.02]}
    keys = ["pass@32 − base", "pass@32 − GRPO", "greedy − base", "greedy − GRPO", "cross pass@32 − base",
            "cross pass@32 − GRPO", "math pass@32 − base", "math pass@32 − GRPO"]
    numbers = {"differences": {"DPH-F": {k: diff for k in keys}, "DPH-JS": {"greedy − base": diff, "pass@32 − DAPO": diff}}}
    lines = reproduce.claims(numbers, 32).splitlines()
    # A row per claim some variant has a number for (the 8 keys, and DAPO's): rows nobody has
    # (style entropy, ties, DAPO's other claims) are left out.
    assert lines[0] == "| claim | DPH-F | DPH-JS |" and len(lines) == 2 + 9
    assert "| pass@32 kept (vs base) | holds: +1.0 [-1.0, +2.0] | — |" in lines
    assert "| pass@32 above GRPO | does not hold (no difference beyond ±3): +1.0 [-1.0, +2.0] | — |" in lines
    assert lines[-1] == "| pass@32 above DAPO | — | does not hold (no difference beyond ±3): +1.0 [-1.0, +2.0] |"
    assert not any("entropy" in line or "ties" in line for line in lines)


def test_claims_read_pass_at_k_per_style_for_each_split_s_styles(reproduce):
    """Per-style rows (the paper's Figure 4) come after the fixed ones, kept vs base and above GRPO."""
    held, lost = {"mean": 0.0, "ci95": [-0.01, 0.01]}, {"mean": -0.3, "ci95": [-0.4, -0.2]}
    numbers = {"styles": {"nulls": ["count_star", "count_col"]}, "differences": {"DPH-JS": {
        "nulls count_col pass@64 − base": held, "nulls count_col pass@64 − GRPO": {"mean": 0.2, "ci95": [0.1, 0.3]},
        "nulls count_star pass@64 − base": lost}}}
    lines = reproduce.claims(numbers, 64).splitlines()
    assert lines[2:] == [
        "| nulls `count_star` pass@64 kept (vs base) | does not hold: -30.0 [-40.0, -20.0] |",
        "| nulls `count_col` pass@64 kept (vs base) | holds: +0.0 [-1.0, +1.0] |",
        "| nulls `count_col` pass@64 above GRPO | holds: +20.0 [+10.0, +30.0] |",
    ]


def test_a_budget_for_another_model_presamples_into_its_own_folder(reproduce):
    """smollm2-cpu's overrides reach every run; DPH runs pre-sample apart from the tiny model's."""
    from types import SimpleNamespace

    budget = reproduce.BUDGETS["smollm2-cpu"]
    args = SimpleNamespace(overrides=budget["config"])
    grpo, dph = reproduce.run_config("GRPO", args), reproduce.run_config("DPH-JS", args)
    tiny = reproduce.run_config("DPH-JS", SimpleNamespace(overrides={}))
    for config in (grpo, dph):
        assert (config.model_name, config.lr, config.prompts_per_step) == ("smollm2-135m-sft", 1e-5, 4)
        assert config.env_config == {"data": "sql_synth/train[:128]"}
    assert dph.presample.out_dir == tiny.presample.out_dir + "_smollm2-135m-sft"
    assert set(budget["methods"]) <= set(reproduce.METHODS)


def test_the_ties_budget_compares_all_trajectories_with_one(reproduce):
    """DPH-JS keeps all 8 trajectories of 8-of-8 prompts, DPH-JS (refine) one, each in its own
    pre-sampling folder; every ties run answers in up to 96 tokens."""
    from types import SimpleNamespace

    budget = reproduce.BUDGETS["ties"]
    args = SimpleNamespace(overrides=budget["config"])
    all_, refine = reproduce.run_config("DPH-JS", args), reproduce.run_config("DPH-JS (refine)", args)
    assert (all_.presample.pef_samples, all_.presample.min_correct) == ("all", 8)
    assert (refine.presample.pef_samples, refine.presample.min_correct) == ("refine", 8)
    assert refine.presample.out_dir == all_.presample.out_dir + "_refine"
    # each seed pre-samples into its own folder (the seed is part of what the folder holds)
    seeded = [reproduce.run_config("DPH-JS", args, seed) for seed in (0, 1)]
    assert [c.presample.out_dir for c in seeded] == [all_.presample.out_dir + f"_seed{s}" for s in (0, 1)]
    assert [c.seed for c in seeded] == [0, 1]
    assert [c.presample_config().sampling.seed for c in seeded] == [0, 1]
    assert reproduce.run_config("GRPO", args, 2).seed == 2
    assert all_.max_response_length == refine.max_response_length == 96
    assert set(budget["methods"]) <= set(reproduce.METHODS) and budget["n"] >= 64


@pytest.mark.parametrize("ci,reading", [([0.01, 0.2], "DPH-JS better than GRPO"), ([-0.2, -0.01], "DPH-JS worse than GRPO"),
                                        ([-0.01, 0.2], "cannot tell"), ([0.0, 0.0], "cannot tell")])
def test_primary_endpoint_reading_is_the_pre_registered_one(reproduce, ci, reading):
    assert reproduce.primary_reading({"mean": sum(ci) / 2, "ci95": ci}) == reading


def _ties_result(name: str, extremum_share: float, seed: int):
    """An evaluation of 20 ties prompts x 8 samples: ``extremum`` answers are right, ``order_limit`` ones wrong."""
    import numpy as np

    from rllib_dph.envs.suites import load_split
    from rllib_dph.evaluation.results import EvalResult, PromptRecord

    rng = np.random.default_rng(seed)
    records = []
    for i, task in enumerate(load_split("sql_synth/test_ties")[:20]):
        styles = ["extremum" if u < extremum_share else "order_limit" for u in rng.random(8)]
        records.append(PromptRecord(task_id=task.id, index=i, correct=[s == "extremum" for s in styles],
                                    answers=[s for s in styles], styles=styles, num_truncated=0, greedy_correct=False,
                                    task_fingerprint=task.fingerprint))
    return EvalResult(records=records, n=8, temperature=1.0, top_p=1.0, max_new_tokens=96, seed=0, ks=[1, 8], name=name)


def test_a_table_of_the_ties_split_alone_has_its_columns_and_entropy_claims(reproduce):
    """A budget evaluated on ties only (no in-domain split) still makes its tables: ties pass@k,
    the ties style entropy, the paired differences and the ties claims, and nothing of other splits."""
    from types import SimpleNamespace

    base = {"ties": _ties_result("base", 0.3, 0)}
    runs = {"GRPO": [{"ties": _ties_result("GRPO", 0.02, 1)}], "DPH-JS": [{"ties": _ties_result("DPH-JS", 0.3, 2)}]}
    text, numbers = reproduce.tables(base, runs, SimpleNamespace(n=8))
    header = text.splitlines()[0]
    assert header == "| method | ties pass@8 | ties extremum pass@8 | ties style entropy |"
    grpo = numbers["differences"]["GRPO"]
    assert grpo["ties pass@8 − base"]["ci95"][1] < 0  # GRPO lost the minority approach
    assert grpo["ties style entropy − base"]["mean"] < 0
    assert "ties pass@8 − GRPO" in numbers["differences"]["DPH-JS"]
    assert "| ties styles above GRPO (entropy, bits) | holds" in text
    assert "greedy" not in text and "keep" not in text


def test_a_run_evaluated_on_every_split_is_reused_without_its_checkpoint(reproduce, tmp_path):
    """Evaluations brought from another machine (no checkpoint) make a run done: it is neither
    trained (so not pre-sampled for) nor evaluated again."""
    run = tmp_path / "runs" / "GRPO_seed0"
    run.mkdir(parents=True)
    _ties_result("GRPO", 0.1, 0).to_json(reproduce.eval_path(run, "ties"))
    assert reproduce.missing_splits(run, ["ties"]) == []
    assert reproduce.missing_splits(run, ["in-domain", "ties"]) == ["in-domain"]


def test_run_all_trains_what_lacks_an_evaluation_then_evaluates_each_split_as_its_own_job(reproduce, tmp_path, monkeypatch):
    """The schedule: the base model's missing evaluations and the trainings first, each run's
    evaluations (one job per split) only after its training; a run evaluated on every split is
    skipped, a run evaluated on some splits is trained (its checkpoint kept) and evaluated on the rest."""
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    calls = []

    def train(method, seed, out, args):
        calls.append(("train", method, seed))
        return "trained"

    def evaluate(method, seed, out, split, args):
        calls.append(("evaluate", method, seed, split))
        return "evaluated"

    monkeypatch.setattr(reproduce, "worker_pool", lambda workers: ThreadPoolExecutor(1))
    monkeypatch.setattr(reproduce, "train", train)
    monkeypatch.setattr(reproduce, "evaluate", evaluate)
    monkeypatch.setattr(reproduce, "load_evaluation", lambda out, split: True)
    for folder, split in [("runs/GRPO_seed0", "ties"), ("runs/GRPO_seed0", "math"), ("runs/GRPO_seed1", "math"),
                          ("base", "math")]:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        reproduce.eval_path(tmp_path / folder, split).write_text("{}")
    args = SimpleNamespace(methods=["GRPO"], seeds=[0, 1, 2], splits=["ties", "math"], workers=1)
    runs = reproduce.run_all(tmp_path, args, 0.0)
    assert [(m, s) for m, s, _ in runs] == [(None, 0), ("GRPO", 0), ("GRPO", 1), ("GRPO", 2)]
    assert calls[:3] == [("evaluate", None, 0, "ties"), ("train", "GRPO", 1), ("train", "GRPO", 2)]
    assert sorted(calls[3:], key=str) == [("evaluate", "GRPO", 1, "ties"), ("evaluate", "GRPO", 2, "math"),
                                          ("evaluate", "GRPO", 2, "ties")]


def test_a_stored_evaluation_of_changed_data_is_refused(reproduce, tmp_path, capsys):
    """An evaluation of the ties family's version 1 (other questions under the same ids) is not
    reused as if it were of the data now; one written before fingerprints is read with a warning."""
    import dataclasses

    run = tmp_path / "GRPO_seed0"
    result = _ties_result("GRPO", 0.1, 0)
    stale = dataclasses.replace(result, records=[dataclasses.replace(r, task_fingerprint="f" * 16) for r in result.records])
    stale.to_json(reproduce.eval_path(run, "ties"))
    with pytest.raises(ValueError, match=r"eval_ties.json: 'sql_synth/test_ties/00000' was another question"):
        reproduce.missing_splits(run, ["ties"])
    legacy = dataclasses.replace(result, records=[dataclasses.replace(r, task_fingerprint="") for r in result.records])
    legacy.to_json(reproduce.eval_path(run, "ties"))
    assert reproduce.load_results(run, ["ties"])["ties"].records == legacy.records
    assert reproduce.missing_splits(run, ["ties"]) == []  # read once, however often it is asked for
    assert capsys.readouterr().out.count("written before task fingerprints were recorded; 20 of its 20 prompts") == 1


def test_archived_ties_evaluations_of_the_old_family_are_refused(reproduce, tmp_path, capsys):
    """The archived SmolLM2 evaluations (docs/gpu_runs, family version 1 for test_ties) cannot be
    paired with runs on the family as it is now; their test-split evaluation, of unchanged data, can."""
    import pathlib
    import tarfile

    archive = pathlib.Path(__file__).resolve().parents[1] / "docs/gpu_runs/2026-11-26-h100-smollm2-ties-v1.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    with pytest.raises(ValueError, match="was another question when it was evaluated"):
        reproduce.load_evaluation(tmp_path / "base", "ties")
    with pytest.raises(ValueError, match="was another question when it was evaluated"):
        reproduce.missing_splits(tmp_path / "runs" / "GRPO_seed0", ["ties"])
    assert len(reproduce.load_evaluation(tmp_path / "base", "in-domain").records) == 100
    assert "warning" not in capsys.readouterr().out


def test_archived_evaluations_of_the_current_family_are_reused_as_they_are(reproduce, tmp_path, capsys):
    """The archived SmolLM2 base and GRPO evaluations on test_ties (family version 2, 100 prompts,
    n = 64) are of the split as it is now: a run under the same budget reuses them unretrained,
    which is how a later GPU run trains DPH-JS alone beside them (docs/gpu.md)."""
    import pathlib
    import tarfile

    archive = pathlib.Path(__file__).resolve().parents[1] / "docs/gpu_runs/2026-11-26-h100-smollm2-ties-v2.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    assert reproduce.missing_splits(tmp_path / "base", ["ties"]) == []
    assert reproduce.missing_splits(tmp_path / "runs" / "GRPO_seed0", ["ties"]) == []
    grpo = reproduce.load_evaluation(tmp_path / "runs" / "GRPO_seed0", "ties")
    assert (len(grpo.records), grpo.n, grpo.max_new_tokens) == (100, 64, 96)
    assert "warning" not in capsys.readouterr().out


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_longer_warm_starts_budgets_change_the_model_only(reproduce, device):
    """smollm2-600-ties-<device> is smollm2-ties-<device> on smollm2-135m-sft-600, nothing else
    (and smollm2-600-nulls-<device> the nulls budget on smollm2-135m-sft-600-nulls); its DPH-JS
    runs pre-sample into a folder of their own (the two warm starts never share D_pef)."""
    from types import SimpleNamespace

    short, long = reproduce.BUDGETS[f"smollm2-ties-{device}"], reproduce.BUDGETS[f"smollm2-600-ties-{device}"]
    assert {k: v for k, v in long.items() if k != "config"} == {k: v for k, v in short.items() if k != "config"}
    assert long["config"] == {**short["config"], "model_name": "smollm2-135m-sft-600"}
    nulls, long_nulls = reproduce.BUDGETS[f"smollm2-nulls-{device}"], reproduce.BUDGETS[f"smollm2-600-nulls-{device}"]
    assert long_nulls == {**nulls, "config": {**nulls["config"], "model_name": "smollm2-135m-sft-600-nulls"}}
    configs = {name: reproduce.run_config("DPH-JS", SimpleNamespace(overrides=b["config"]), 0)
               for name, b in (("short", short), ("long", long))}
    assert configs["long"].model_name == "smollm2-135m-sft-600"
    assert configs["long"].presample.out_dir.endswith("_smollm2-135m-sft-600_seed0")
    assert configs["long"].presample.out_dir != configs["short"].presample.out_dir


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_real_models_nulls_budgets_change_model_data_and_methods_only(reproduce, device):
    """smollm2-nulls-<device> is smollm2-ties-<device> on the NULL warm start, trained on the same
    number of the first prompts of the NULL mix, GRPO against DPH-JS (eta = 10), evaluated on
    test and test_nulls; its DPH-JS pre-samples into a folder of its own."""
    from types import SimpleNamespace

    ties, nulls = reproduce.BUDGETS[f"smollm2-ties-{device}"], reproduce.BUDGETS[f"smollm2-nulls-{device}"]
    changed = {"config", "methods", "splits"}
    assert {k: v for k, v in nulls.items() if k not in changed} == {k: v for k, v in ties.items() if k not in changed}
    assert nulls["methods"] == ["GRPO", "DPH-JS (η=10)"] and nulls["splits"] == ["in-domain", "nulls"]
    rows = ties["config"]["env_config"]["data"].removeprefix("sql_synth/train")
    assert nulls["config"] == {**ties["config"], "model_name": "smollm2-135m-sft-nulls",
                               "env_config": {"data": f"sql_synth/train@nulls=0.1{rows}"}}
    config = reproduce.run_config("DPH-JS (η=10)", SimpleNamespace(overrides=nulls["config"]), 0)
    assert config.pef_coeff == 10.0 and config.presample.out_dir.endswith("_smollm2-135m-sft-nulls_seed0")
    assert ("DPH-JS (η=10)", "nulls") in reproduce.PRIMARY_ENDPOINTS


def test_the_nulls_budget_trains_the_variant_on_the_mix_and_shares_pre_sampling_across_eta(reproduce):
    """The NULL family's comparison: tiny-sql-math-nulls on train@nulls=0.1; DPH-JS at η = 10
    differs from the tuned DPH-JS only in the term's weight, so a seed's pre-sampling is shared."""
    from types import SimpleNamespace

    budget = reproduce.BUDGETS["nulls"]
    args = SimpleNamespace(overrides=budget["config"])
    tuned, heavy = reproduce.run_config("DPH-JS", args, 1), reproduce.run_config("DPH-JS (η=10)", args, 1)
    assert heavy.pef_coeff == 10.0 and tuned.pef_coeff != 10.0
    assert heavy.presample.out_dir == tuned.presample.out_dir
    assert heavy.presample_config() == tuned.presample_config()
    for method in budget["methods"]:
        config = reproduce.run_config(method, args, 0)
        assert config.model_name == "tiny-sql-math-nulls"
        assert config.env_config["data"] == "sql_synth/train@nulls=0.1"
    assert budget["splits"] == ["in-domain", "nulls"] and budget["n"] == 64
    assert ("DPH-JS (η=10)", "nulls") in reproduce.PRIMARY_ENDPOINTS


def test_a_table_of_the_nulls_split_names_its_robust_approach(reproduce):
    from types import SimpleNamespace

    import numpy as np

    from rllib_dph.envs.suites import load_split
    from rllib_dph.evaluation.results import EvalResult, PromptRecord

    def result(name, share, seed):
        rng = np.random.default_rng(seed)
        records = []
        for i, task in enumerate(load_split("sql_synth/test_nulls")[:20]):
            styles = ["count_col" if u < share else "count_star" for u in rng.random(8)]
            records.append(PromptRecord(task_id=task.id, index=i, correct=[s == "count_col" for s in styles],
                                        answers=styles, styles=styles, num_truncated=0, greedy_correct=False,
                                        task_fingerprint=task.fingerprint))
        return EvalResult(records=records, n=8, temperature=1.0, top_p=1.0, max_new_tokens=96, seed=0, ks=[1, 8],
                          name=name)

    base = {"nulls": result("base", 0.3, 0)}
    runs = {"GRPO": [{"nulls": result("GRPO", 0.02, 1)}], "DPH-JS (η=10)": [{"nulls": result("DPH-JS", 0.3, 2)}]}
    text, numbers = reproduce.tables(base, runs, SimpleNamespace(n=8))
    assert text.splitlines()[0] == "| method | nulls pass@8 | nulls count_col pass@8 | nulls style entropy |"
    assert numbers["differences"]["DPH-JS (η=10)"]["nulls pass@8 − GRPO"]["ci95"][0] > 0
    assert "| nulls pass@8 above GRPO (the primary endpoint for DPH-JS (η=10)) | holds" in text


def test_curve_runs_the_collapse_searchs_curve_of_the_budgets_family(reproduce):
    """``--curve`` is collapse_search's curve for the family; its commands build."""
    import subprocess

    command = reproduce.curve_command("ties-quick")
    assert command[-3:] == ["--curve", "--family", "ties"] and command[1].endswith("research/collapse_search.py")
    printed = subprocess.run(reproduce.curve_command("nulls") + ["--dry-run"], check=True, capture_output=True,
                             text=True).stdout.splitlines()
    assert len(printed) == 3 and all("grpo_budget.py" in line and "test_nulls" in line for line in printed)


def test_plots_pool_each_methods_seeds_and_draw_styles_sampled_by_a_run_only(reproduce, tmp_path):
    """A base model whose samples name no style beside runs (lists of seeds) that do: the per-style
    bars are drawn from the runs (the check once read only the first entry's styles, a list after it)."""
    import dataclasses

    base = _ties_result("base", 0.3, 0)
    base = dataclasses.replace(base, records=[dataclasses.replace(r, styles=["none"] * 8) for r in base.records])
    runs = {"GRPO": [{"ties": _ties_result("GRPO", 0.1, s)} for s in (1, 2)]}
    reproduce.plots({"ties": base}, runs, tmp_path)
    assert (tmp_path / "pass_at_k_ties.png").is_file() and (tmp_path / "style_pass_at_k_ties.png").is_file()
    assert (tmp_path / "styles_ties.png").is_file()


def _nulls_result(name, share, seed, count=40):
    import numpy as np

    from rllib_dph.envs.suites import load_split
    from rllib_dph.evaluation.results import EvalResult, PromptRecord

    rng = np.random.default_rng(seed)
    records = []
    for i, task in enumerate(load_split("sql_synth/test_nulls")[:count]):
        styles = ["count_col" if u < share else "count_star" for u in rng.random(8)]
        records.append(PromptRecord(task_id=task.id, index=i, correct=[s == "count_col" for s in styles],
                                    answers=styles, styles=styles, num_truncated=0, greedy_correct=False,
                                    task_fingerprint=task.fingerprint))
    return EvalResult(records=records, n=8, temperature=1.0, top_p=1.0, max_new_tokens=96, seed=0, ks=[1, 8], name=name)


def test_seed_statistics_give_per_seed_values_welch_permutation_and_clusters(reproduce):
    """Every multi-seed endpoint against GRPO: seeds, bootstrap, Welch t, permutation p, clusters."""
    from types import SimpleNamespace

    base = {"nulls": _nulls_result("base", 0.3, 0)}
    runs = {"GRPO": [{"nulls": _nulls_result("GRPO", 0.03, s)} for s in (1, 2, 3)],
            "DPH-JS (η=10)": [{"nulls": _nulls_result("DPH-JS", 0.3, s)} for s in (4, 5, 6)]}
    text, numbers = reproduce.tables(base, runs, SimpleNamespace(n=8))
    entry = numbers["seed_statistics"]["DPH-JS (η=10)"]["nulls pass@8 − GRPO"]
    assert len(entry["method_seeds"]) == len(entry["grpo_seeds"]) == 3
    assert entry["mean"] == pytest.approx(sum(entry["method_seeds"]) / 3 - sum(entry["grpo_seeds"]) / 3)
    assert entry["permutation_p"] == pytest.approx(0.1)  # 3 seeds a side: the smallest p there is
    assert entry["welch"][0] > 0 and entry["cluster_bootstrap"][0] > 0
    # The first 40 questions' clusters; the cluster interval is the wider one.
    assert entry["clusters"] < 40
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(entry["cluster_bootstrap"]) >= 0.9 * width(entry["bootstrap"])
    assert "| nulls pass@8 − GRPO | DPH-JS (η=10) |" in text and "clusters) |" in text


def test_nulls_clusters_are_database_table_column(reproduce):
    from rllib_dph.envs.suites import load_split

    tasks = load_split("sql_synth/test_nulls")
    clusters = [reproduce.nulls_cluster(t) for t in tasks]
    assert len(set(clusters)) == 96
    first = clusters[0]
    assert first[0] == tasks[0].ground_truth["db_id"] and f"COUNT({first[2]})" in tasks[0].ground_truth["gold_sql"]


def test_ties_clusters_are_database_table_column(reproduce):
    from rllib_dph.envs.suites import load_split

    tasks = load_split("sql_synth/test_ties")
    clusters = [reproduce.ties_cluster(t) for t in tasks]
    assert len(set(clusters)) == 77
    for task, (db, table, column) in zip(tasks, clusters):
        sql = task.ground_truth["gold_sql"]
        assert db == task.ground_truth["db_id"] and table.split("+")[0] in sql and column in sql


def test_in_domain_clusters_are_database_and_tables(reproduce):
    from rllib_dph.envs.suites import load_split

    tasks = load_split("sql_synth/test")
    clusters = [reproduce.schema_cluster(t) for t in tasks]
    assert len(set(clusters)) == 86 and reproduce.CLUSTERS["in-domain"] is reproduce.schema_cluster
    joined = next(c for t, c in zip(tasks, clusters) if " JOIN " in t.ground_truth["gold_sql"])
    assert "+" in joined[1]
    for task, (db, tables) in zip(tasks, clusters):
        assert db == task.ground_truth["db_id"] and all(t in task.ground_truth["gold_sql"] for t in tables.split("+"))


def test_the_countdown_budgets_train_the_warm_start_on_reasoning_gyms_puzzles(reproduce):
    from types import SimpleNamespace

    budget = reproduce.BUDGETS["countdown"]
    args = SimpleNamespace(overrides=budget["config"])
    assert budget["seeds"] == [0, 1, 2] and budget["n"] == 64 and budget["splits"] == ["countdown"]
    assert budget["methods"] == ["GRPO", "DPH-JS (η=10)"] and ("DPH-JS (η=10)", "countdown") in reproduce.PRIMARY_ENDPOINTS
    configs = {m: reproduce.run_config(m, args, 0) for m in budget["methods"] + reproduce.COUNTDOWN_SECONDARY}
    for method, config in configs.items():
        assert config.model_name == "tiny-countdown-long" and config.env == "rllib_dph/ReasoningGym-v0", method
        assert config.env_config["dataset"] == "countdown" and config.env_config["data"] is None, method
    dph = configs["DPH-JS (η=10)"]
    assert (dph.divergence, dph.pef_coeff, dph.presample.min_correct, dph.presample.pef_samples) == ("js", 10.0, 8, "all")
    for method, divergence in (("DPH-F (η=10)", "forward_kl"), ("NLL (η=10)", "nll")):
        assert (configs[method].divergence, configs[method].pef_coeff) == (divergence, 10.0)
        assert configs[method].presample.out_dir == dph.presample.out_dir  # one D_pef for the controls
    assert configs["DPH-JS (η=10, refine)"].presample.pef_samples == "refine"
    assert configs["RKL (β=0.625)"].kl_coeff == 0.625 and configs["GRPO (entropy 0.01)"].entropy_coeff == 0.01
    test_env = reproduce.SPLITS["countdown"][1]
    assert test_env["split"] == "test" and test_env["train_size"] == configs["GRPO"].env_config["size"]


def test_the_smollm2_countdown_budgets_train_its_warm_start_on_the_first_training_puzzles(reproduce):
    from types import SimpleNamespace

    from rllib_dph.envs.countdown import SMOLLM2_COUNTDOWN_SFT
    from rllib_dph.models.catalog import WARM_STARTS

    collapse, budget = reproduce.BUDGETS["smollm2-countdown-cpu-collapse"], reproduce.BUDGETS["smollm2-countdown-cpu"]
    assert collapse["methods"] == ["GRPO"] and collapse["seeds"] == [0]
    assert budget["methods"] == ["GRPO", "DPH-JS (η=10)"] and budget["seeds"] == [0, 1, 2]
    assert (budget["iterations"], budget["eval_limit"], budget["n"], budget["splits"]) == (30, 100, 16, ["countdown"])
    args = SimpleNamespace(overrides=budget["config"])
    configs = {m: reproduce.run_config(m, args, 1) for m in budget["methods"] + reproduce.COUNTDOWN_SECONDARY}
    for method, config in configs.items():
        assert config.model_name == "smollm2-135m-countdown" and config.env_config["size"] == 128, method
        assert (config.dtype, config.prompts_per_step, config.group_size, config.lr) == ("float32", 4, 8, 1e-5), method
    dph = configs["DPH-JS (η=10)"]
    assert (dph.divergence, dph.pef_coeff, dph.presample.min_correct) == ("js", 10.0, 8)
    assert dph.presample.out_dir.endswith("_smollm2-135m-countdown_seed1")
    # The warm start's SFT puzzles are the 2,000 the test split is held out from.
    assert WARM_STARTS["smollm2-135m-countdown"].countdown is SMOLLM2_COUNTDOWN_SFT
    assert SMOLLM2_COUNTDOWN_SFT.size == reproduce.SPLITS["countdown"][1]["train_size"]


def test_the_countdown_tables_read_pass_at_k_and_the_shapes(reproduce):
    from types import SimpleNamespace

    import numpy as np

    from rllib_dph.evaluation.results import EvalResult, PromptRecord

    def result(name, share, seed):
        rng = np.random.default_rng(seed)
        records = []
        for i in range(30):
            right = rng.random(8) < share
            styles = ["+-,p0,given" if r else "*-,p1,mixed" for r in right]
            records.append(PromptRecord(task_id=f"countdown/test/s0/{i}", index=i, correct=list(right),
                                        answers=styles, styles=styles, num_truncated=0, greedy_correct=bool(right[0]),
                                        solutions=[s + str(j) for j, s in enumerate(styles)]))
        return EvalResult(records=records, n=8, temperature=1.0, top_p=1.0, max_new_tokens=48, seed=0, ks=[1, 4, 8], name=name)

    base = {"countdown": result("base", 0.3, 0)}
    runs = {"GRPO": [{"countdown": result("GRPO", 0.02, 1)}], "DPH-JS (η=10)": [{"countdown": result("DPH", 0.3, 2)}]}
    text, numbers = reproduce.tables(base, runs, SimpleNamespace(n=8))
    assert text.splitlines()[0].startswith("| method | countdown greedy | countdown pass@1 | countdown pass@4 | countdown pass@8 |")
    assert numbers["differences"]["GRPO"]["countdown pass@8 − base"]["ci95"][1] < 0
    assert "| countdown pass@8 above GRPO (the primary endpoint for DPH-JS (η=10)) | holds" in text
    shapes = numbers["countdown shapes"]
    assert shapes["Base model"]["operators=+-"]["mean"] == pytest.approx(
        sum(r.styles.count("+-,p0,given") for r in base["countdown"].records) / 240)
    assert shapes["GRPO"]["order=mixed"]["mean"] > 0.9 and shapes["GRPO"]["distinct shapes"] == 2
