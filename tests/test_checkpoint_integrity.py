"""A checkpoint lists its files' sha256 last (manifest.sha256): one cut short (a copy stopped by a
full disk) or changed is never restored, and a resume falls back to the newest intact checkpoint of
its trial with a warning naming the damaged one."""

import json
import subprocess

import pytest
from ray.rllib.algorithms.algorithm import Algorithm

from rllib_dph.algorithms.checkpoints import CheckpointError, checkpoint_problem, intact_checkpoint
from rllib_dph.cli.experiments import PREFLIGHT_EXIT_CODE
from rllib_dph.cli.main import main
from rllib_dph.files import MANIFEST_FILE


@pytest.fixture(scope="module")
def trial(ray_session, tmp_path_factory):
    """A trial folder with checkpoint_000001 and checkpoint_000002 (after iterations 1 and 2)."""
    from rllib_dph.algorithms.grpo import GRPOConfig

    config = (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name="tiny-random", max_response_length=8)
        .training(group_size=2, prompts_per_step=2)
        .debugging(seed=0)
    )
    folder = tmp_path_factory.mktemp("trial")
    algo = config.build_algo()
    try:
        for i in (1, 2):
            algo.train()
            algo.save_to_path(str(folder / f"checkpoint_00000{i}"))
    finally:
        algo.stop()
    return folder


def _largest_file(checkpoint):
    return max((p for p in checkpoint.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _damaged_copy(trial, tmp_path, damage):
    """A copy of the trial folder whose checkpoint_000002 ``damage(folder)`` damaged: (the copy, the
    damaged file)."""
    import shutil

    copy = shutil.copytree(trial, tmp_path / "trial")
    return copy, damage(copy / "checkpoint_000002")


def test_a_checkpoint_lists_each_of_its_files_sha256_last(trial):
    checkpoint = trial / "checkpoint_000002"
    listed = {line.split("  ", 1)[1] for line in (checkpoint / MANIFEST_FILE).read_text().splitlines()}
    on_disk = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
    assert listed == on_disk - {MANIFEST_FILE} and "rllib_checkpoint.json" in listed
    subprocess.run(["sha256sum", "--check", "--quiet", MANIFEST_FILE], cwd=checkpoint, check=True)
    assert checkpoint_problem(checkpoint) is None


def _truncate(checkpoint):
    largest = _largest_file(checkpoint)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
    return largest


def _flip_a_bit(checkpoint):
    largest = _largest_file(checkpoint)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0x01
    largest.write_bytes(bytes(data))
    return largest


def _cut_before_the_manifest(checkpoint):
    (checkpoint / MANIFEST_FILE).unlink()
    return checkpoint / MANIFEST_FILE


@pytest.mark.parametrize("damage", [_truncate, _flip_a_bit, _cut_before_the_manifest])
def test_a_damaged_checkpoint_is_refused_and_the_newest_intact_one_is_used(trial, tmp_path, damage):
    copy, damaged = _damaged_copy(trial, tmp_path, damage)
    bad = copy / "checkpoint_000002"
    problem = checkpoint_problem(bad)
    assert problem.startswith(f"{bad} is incomplete or damaged: ")
    assert str(damaged if damage is not _cut_before_the_manifest else MANIFEST_FILE) in problem
    with pytest.raises(CheckpointError, match="it is not restored"):
        Algorithm.from_checkpoint(str(bad))
    warnings = []
    assert intact_checkpoint(bad, warn=warnings.append) == str(copy / "checkpoint_000001")
    (warning,) = warnings
    assert f"checkpoint {bad} is not used" in warning and str(copy / "checkpoint_000001") in warning


def test_tunes_restore_of_a_damaged_latest_continues_from_the_intact_one(trial, tmp_path):
    copy, _ = _damaged_copy(trial, tmp_path, _truncate)
    algo = Algorithm.from_checkpoint(str(copy / "checkpoint_000001"))
    try:
        algo.train()
        algo.load_checkpoint(str(copy / "checkpoint_000002"))  # what Tune calls on --resume
        assert algo.iteration == 1
    finally:
        algo.stop()


def test_a_trial_without_an_intact_checkpoint_is_refused(trial, tmp_path, capsys, without_ray):
    copy, _ = _damaged_copy(trial, tmp_path, _truncate)
    _truncate(copy / "checkpoint_000001")
    with pytest.raises(CheckpointError, match="no earlier checkpoint of its trial is intact"):
        intact_checkpoint(copy / "checkpoint_000002")
    config = {"model_name": "tiny-random", "max_response_length": 8, "env_config": {"data": "sql_synth/test"}}
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0", "--config", json.dumps(config),
              "--storage-path", str(tmp_path / "runs"), "--from-checkpoint", str(copy / "checkpoint_000002")])
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    assert f"--from-checkpoint: {copy / 'checkpoint_000002'} is incomplete or damaged" in capsys.readouterr().err
