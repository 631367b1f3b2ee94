"""Data loading for the verifier envs: parquet / jsonl files, suite splits and lists → tasks."""

from rllib_dph.envs.data.loaders import load_tasks

__all__ = ["load_tasks"]
