"""Pre-sampled files are checked on every read: each has its sha256 beside it; a corrupted or
truncated D_pef or D_exp file is refused naming the file and the fix (in the driver, a learner and
an env runner), never trained on; a deleted D_exp of a pre-sampling folder is made again, and a
missing one never turns into training on the whole split."""

import hashlib
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.algorithms.dph.pef_rows import PefRowSampler
from rllib_dph.algorithms.dph.presample import EXP_FILE, PEF_FILE, PefFileError, prepare_pef
from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner
from test_dph import KINDS, TOY_ENV, _dph_config, presampled  # noqa: F401  (the module-scoped pre-sampling fixture)


@pytest.fixture
def folder(presampled, tmp_path):  # noqa: F811
    """A copy of the pre-sampled folder that a test may damage."""
    out, _ = presampled
    return shutil.copytree(out, tmp_path / "presample")


def _flip_one_bit(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def test_each_file_has_its_sha256_beside_it_in_sha256sum_format(folder):
    for name in (PEF_FILE, EXP_FILE):
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert (folder / f"{name}.sha256").read_text() == f"{digest}  {name}\n"
    subprocess.run(["sha256sum", "--check", "--quiet", f"{PEF_FILE}.sha256", f"{EXP_FILE}.sha256"],
                   cwd=folder, check=True)


@pytest.mark.parametrize("where", ["header", "middle", "footer"])
def test_a_flipped_bit_in_d_pef_is_refused_by_the_driver_and_the_learner(folder, where):
    pef = folder / PEF_FILE
    size = pef.stat().st_size
    _flip_one_bit(pef, {"header": 2, "middle": size // 2, "footer": size - 12}[where])
    config = _dph_config(pef)
    for read in (lambda: prepare_pef(config, progress=False), lambda: PefRowSampler(str(pef))):
        with pytest.raises(PefFileError) as error:
            read()
        message = str(error.value)
        assert f"pre-sampled file {pef} is corrupted or truncated" in message
        assert "it is not trained on" in message and f"Delete {pef} and {PEF_FILE}.sha256" in message


def test_a_truncated_d_pef_is_refused_naming_it_not_with_a_parquet_traceback(folder):
    pef = folder / PEF_FILE
    pef.write_bytes(pef.read_bytes()[: pef.stat().st_size // 2])
    with pytest.raises(PefFileError, match=f"pre-sampled file {pef} is corrupted or truncated: its "):
        PefRowSampler(str(pef))


def test_a_file_without_its_checksum_is_refused(folder):
    (folder / f"{PEF_FILE}.sha256").unlink()
    with pytest.raises(PefFileError, match="has no readable checksum file"):
        prepare_pef(_dph_config(folder / PEF_FILE), progress=False)


def test_a_missing_or_corrupted_d_exp_is_refused_also_by_an_env_runner(folder):
    exp = folder / EXP_FILE
    config = _dph_config(folder / PEF_FILE, exp_path=str(exp))
    assert config.sampling_env_config["data"] == str(exp)
    _flip_one_bit(exp, exp.stat().st_size // 2)
    with pytest.raises(PefFileError, match=f"pre-sampled file {exp} is corrupted or truncated"):
        prepare_pef(config, progress=False)
    exp.unlink()
    # An env runner (one Ray restarts after the file is gone builds its env the same way) refuses,
    # instead of sampling the whole split, D_pef prompts included.
    with pytest.raises(PefFileError, match=f"pre-sampled file {exp} does not exist"):
        LLMEnvRunner(config=config)


def test_a_deleted_d_exp_of_a_presampling_folder_is_made_again(tmp_path):
    out = tmp_path / "presample"
    config = (
        DPHConfig()
        .environment(TOY_ENV)
        .llm(model_name="tiny-random", max_response_length=8)
        .dph(presample={"out_dir": str(out), "k": 4, "min_correct": 3})
        .debugging(seed=0)
    )
    prepare_pef(config, progress=False)
    written = {name: (out / name).read_bytes() for name in (PEF_FILE, EXP_FILE)}
    assert pq.read_metadata(out / EXP_FILE).num_rows < len(KINDS)  # D_exp is not the whole split
    (out / EXP_FILE).unlink()
    prepare_pef(config, progress=False)
    assert {name: (out / name).read_bytes() for name in written} == written
    assert config.sampling_env_config["data"] == str(out / EXP_FILE)
