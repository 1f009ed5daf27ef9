"""Runs a function on every rank of a process group spawned for one test: gloo on CPUs, or
NCCL with one GPU a rank (rank r on GPU r).

Each rank is a fresh process (torch.multiprocessing's spawn context) joined through a file://
store, with the process group's timeout set, so a rank waiting on a peer that failed gives up
with an error instead of hanging; the parent also kills whatever is left at its own deadline.
A rank's exception comes back as its traceback text."""

from __future__ import annotations

import datetime
import os
import queue as queue_module
import tempfile
import time
import traceback


def _rank_main(target, rank, world_size, store_path, pg_timeout_s, backend, results, args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=pg_timeout_s))
        try:
            results.put((rank, "ok", target(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports every rank's failure
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(target, world_size: int, *args, pg_timeout_s: float = 20.0,
              deadline_s: float = 120.0, backend: str = "gloo") -> dict:
    """{rank: ("ok", value) or ("error", traceback)} of target(rank, world_size, *args) on
    every rank, plus ("hung", "") for a rank that had not finished by deadline_s (killed)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    # One OpenMP and BLAS thread a rank: the ranks share the machine's cores.
    saved = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    os.environ.update({name: "1" for name in saved})
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        try:
            processes = [context.Process(target=_rank_main, daemon=True,
                                         args=(target, rank, world_size, store, pg_timeout_s,
                                               backend, results, args))
                         for rank in range(world_size)]
            for process in processes:
                process.start()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        outcome = {}
        end = time.monotonic() + deadline_s
        while len(outcome) < world_size and time.monotonic() < end:
            try:
                rank, status, value = results.get(timeout=max(0.1, end - time.monotonic()))
            except queue_module.Empty:
                break
            outcome[rank] = (status, value)
        for rank, process in enumerate(processes):
            process.join(timeout=max(0.0, end - time.monotonic()) if rank in outcome else 0)
            if process.is_alive():
                process.kill()
                process.join()
                outcome.setdefault(rank, ("hung", ""))
        for rank in range(world_size):
            outcome.setdefault(rank, ("error", "exited without a result"))
    return outcome


def assert_all_ok(outcome: dict) -> list:
    failures = [f"rank {rank}: {status}\n{value}" for rank, (status, value)
                in sorted(outcome.items()) if status != "ok"]
    assert not failures, "\n".join(failures)
    return [outcome[rank][1] for rank in sorted(outcome)]
