"""tools/offline_kit/vllm_kit.py: what the trimmed vLLM wheel drops, how the kit is cut and dealt into calls,
and which of its wheels the GPU machine installs."""

import pathlib

import pytest

@pytest.fixture(scope="module")
def kit(load_script):
    return load_script("tools/offline_kit/vllm_kit")


@pytest.mark.parametrize("path, dropped", [
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", True),
    ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", True),
    ("vllm/_moe_C_stable_libtorch.abi3.so", True),
    ("vllm/vllm-rs", True),
    ("vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so", True),
    ("vllm/third_party/fmha_sm100/cutlass/include/cute/arch/mma_sm90_gmma_ext.hpp", True),
    ("vllm/_C_stable_libtorch.abi3.so", False),  # the CUDA kernels vllm.platforms.cuda imports
    ("vllm/third_party/pynvml.py", False),  # the CUDA platform's detection imports it
    ("vllm/third_party/triton_kernels/__init__.py", False),
    ("vllm/vllm_flash_attn/__init__.py", False),
    ("vllm/v1/attention/backends/triton_attn.py", False),
    ("vllm-0.26.0.dist-info/METADATA", False),
])
def test_the_trim_drops_only_what_triton_attention_generation_never_loads(kit, path, dropped):
    assert bool(kit.DROP.match(path)) is dropped


def test_split_parts_join_back_to_the_same_bytes(kit, tmp_path):
    wheel = tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    data = bytes(range(256)) * 5000
    wheel.write_bytes(data)
    parts = kit.split_file(wheel, [0.5])
    assert [p.name for p in parts] == [wheel.name + ".part-00", wheel.name + ".part-01"] and not wheel.exists()
    assert parts[0].stat().st_size == 2**19
    assert b"".join(p.read_bytes() for p in sorted(parts)) == data


def test_carry_plan_fills_each_call_to_its_budget_in_order(kit, tmp_path):
    files = []
    for name, mib in [("a", 20), ("b", 30), ("c", 10), ("d", 5), ("e", 40)]:
        path = tmp_path / name
        path.write_bytes(b"\0" * (mib * 2**20))
        files.append(path)
    calls = kit.carry_plan(files, [25, 50])
    assert [[p.name for p in call] for call in calls] == [["a"], ["b", "c", "d"], ["e"]]


def test_carry_plan_refuses_a_file_larger_than_its_call(kit, tmp_path):
    path = tmp_path / "big.whl"
    path.write_bytes(b"\0" * (30 * 2**20))
    with pytest.raises(ValueError, match=r"big.whl is 30.0 MiB, more than call 1's budget of 25 MiB"):
        kit.carry_plan([path], [25, 50])


def test_only_distributions_the_machine_lacks_are_installed(kit, tmp_path):
    """A kit wheel of an installed distribution (any spelling of its name) is kept as installed."""
    wheels = [tmp_path / "py_cpuinfo_that_is_not_installed-9.0.0-py3-none-any.whl",
              tmp_path / f"{'pytest'.upper()}-1.0-py3-none-any.whl"]
    absent, present = kit.missing(wheels)
    assert absent == wheels[:1]
    assert present == {"PYTEST": pytest.__version__}
    assert kit.distribution(pathlib.Path("partial_json_parser-0.2.1.1.post7-py3-none-any.whl")) == "partial_json_parser"
