"""GPU timing with CUDA events: a sustained warm-up, then >= 100 timed calls, the median.

Each call gets its own pair of events recorded on the current stream around it, so the time is
the GPU's. The timed calls are queued straight behind the warm-up calls, with no
synchronisation between them, so that
- the GPU runs without a break from the warm-up into the timed calls, and its clocks have
  settled where they stay under sustained load. (An H100 at its 700 W cap throttles within a
  few hundred ms of load and boosts again after an idle gap; a cell of 100 short calls timed
  right after a gap measured that transient, and whichever implementation caught more of it
  looked faster: the same backward measured 1.58 ms in a sustained loop and 1.77 ms here.)
- host-side overhead (Python, dispatch, autograd) shows only where the host cannot keep ahead
  of the GPU, as in a real training step: a spin kernel (torch.cuda._sleep) holds the GPU at
  the start while the host queues the first calls.
The implementations of one cell are timed in rounds (time_interleaved), the order rotating from
round to round: the one timed right after the cell's checks (an idle gap) met a clock still
settling, and with a fixed order that was always the same one (flashcpp's D128 N = 2k backward
spread over 1.48-1.65 ms across runs where cuDNN, timed second, stayed within 1.45-1.50 ms).
A call too short for the host to keep ahead of (a decode step of 10-60 us against 30-120 us of
Python per call) is timed as a CUDA graph instead (capture): `calls` calls captured into one
graph, each replay timed between events like a call, its time divided by `calls`.
"""
from __future__ import annotations

import contextlib
import statistics
from typing import Callable, Dict, List, Optional, Sequence

WARMUP_MS = 300.0      # sustained warm-up, at least WARMUP_MIN calls and at most WARMUP_MAX
WARMUP_MIN = 3
WARMUP_MAX = 2000
QUEUE_AHEAD_MS = 20.0  # how long the spin kernel holds the GPU while the host queues calls
GRAPH_CALLS = 20       # calls captured into one CUDA graph, at the least (graph_calls)
MIN_REPLAYS = 10       # timed replays of a graph per round, at the least (replays)


def summarize(times_ms: List[float]) -> Dict[str, float]:
    """Median, min, 10th and 90th percentiles of per-call times (pure Python)."""
    s = sorted(times_ms)
    n = len(s)

    def pct(p: float) -> float:
        return s[min(n - 1, max(0, int(round(p * (n - 1)))))]

    return {"median": statistics.median(s), "min": s[0], "p10": pct(0.1), "p90": pct(0.9), "n": n}


def _spin(ms: float) -> None:
    import torch  # noqa: PLC0415
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None or ms <= 0:
        return
    # _sleep counts SM clock cycles; ~1.98 GHz is the H100/H200 boost clock, a guess is enough.
    sleep(int(ms * 1.98e6))


def time_calls(fn: Callable[[int], object], n_sets: int = 1, reps: int = 100) -> Dict[str, float]:
    """Times fn(i) for i cycling over the input sets 0..n_sets-1; returns summarize() in ms."""
    return summarize(timed_calls(fn, n_sets, reps))


def rotation_orders(names: Sequence[str], rounds: int) -> List[List[str]]:
    """The order of each timing round: round r starts at the r-th name (a rotation), so that no
    implementation is always the one timed first after the cell's checks (an idle gap)."""
    k = len(names)
    return [[names[(r + i) % k] for i in range(k)] for r in range(rounds)] if k else []


def graph_calls(n_sets: int) -> int:
    """Calls captured into one graph: at least GRAPH_CALLS, and whole passes over the input
    sets, so that the replays go on rotating through every set in order."""
    return n_sets * -(-GRAPH_CALLS // n_sets)


def replays(reps: int, calls: int) -> int:
    """Timed replays per round of a graph of `calls` calls: at least MIN_REPLAYS, and at least
    `reps` calls in all."""
    return max(MIN_REPLAYS, -(-reps // calls))


def capture(fn: Callable[[int], object], n_sets: int, calls: int) -> Callable[[int], object]:
    """fn(0), fn(1), ... (`calls` calls, the input sets cycling) captured into one CUDA graph,
    after a warm-up outside the capture on a side stream (PyTorch's rule for torch.cuda.graph:
    lazy initialisation, such as a library's workspace, must not happen in the capture).
    Returns a callable that replays the graph (its argument is ignored)."""
    import torch  # noqa: PLC0415
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(max(WARMUP_MIN, n_sets)):
            fn(i % n_sets)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % n_sets)
    return lambda i: graph.replay()


def time_interleaved(fns: Dict[str, Callable[[int], object]], n_sets: int = 1, reps: int = 100,
                     rounds: int = 2, contexts: Optional[Dict[str, Callable]] = None,
                     calls: Optional[Dict[str, int]] = None) -> Dict[str, object]:
    """Times every fn of one cell in `rounds` rounds (rotation_orders), each round a sustained
    warm-up and `reps` timed calls per fn, inside contexts[name]() if given (entered once per
    round, not per call); returns name -> summarize() over all its rounds' calls, or name -> the
    exception that stopped its timing (the others go on). calls[name]: fn is the replay of a
    graph of that many calls (capture); it runs replays(reps, calls) times a round, and each of
    its times counts divided by `calls`: the summary is over per-replay averages."""
    times: Dict[str, List[float]] = {name: [] for name in fns}
    failed: Dict[str, BaseException] = {}
    for order in rotation_orders(list(fns), rounds):
        for name in order:
            if name in failed:
                continue
            k = (calls or {}).get(name, 1)
            try:
                with (contexts[name]() if contexts else contextlib.nullcontext()):
                    ts = timed_calls(fns[name], n_sets, reps if k == 1 else replays(reps, k))
                    times[name] += [t / k for t in ts]
            except Exception as e:  # noqa: BLE001 (OOM, launch failure: that fn is n/a)
                failed[name] = e
    return {name: failed.get(name) or summarize(times[name]) for name in fns}


def timed_calls(fn: Callable[[int], object], n_sets: int, reps: int) -> List[float]:
    """A sustained warm-up, then reps calls each between its own events: per-call times (ms)."""
    import torch  # noqa: PLC0415

    torch.cuda.synchronize()
    # one call to estimate the duration, which sizes the warm-up
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    fn(0)
    t1.record()
    t1.synchronize()
    est = max(t0.elapsed_time(t1), 1e-3)
    warmup = int(min(WARMUP_MAX, max(WARMUP_MIN, WARMUP_MS / est)))

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    _spin(QUEUE_AHEAD_MS)
    for i in range(warmup):
        fn(i % n_sets)
    for r in range(reps):  # right behind the warm-up: no synchronisation, no idle gap
        starts[r].record()
        fn(r % n_sets)
        ends[r].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]
