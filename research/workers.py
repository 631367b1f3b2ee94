"""Worker processes for the research scripts that train several runs at once (one core, one thread each)."""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def _init_worker() -> None:
    """One torch thread and a one-CPU Ray instance per worker process."""
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=1)


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` fresh (spawned) processes, each set up by ``_init_worker``."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker)
