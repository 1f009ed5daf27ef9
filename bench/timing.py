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
"""
from __future__ import annotations

import contextlib
import statistics
from typing import Callable, Dict, List, Optional, Sequence

WARMUP_MS = 300.0      # sustained warm-up, at least WARMUP_MIN calls and at most WARMUP_MAX
WARMUP_MIN = 3
WARMUP_MAX = 2000
QUEUE_AHEAD_MS = 20.0  # how long the spin kernel holds the GPU while the host queues calls


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


def time_interleaved(fns: Dict[str, Callable[[int], object]], n_sets: int = 1, reps: int = 100,
                     rounds: int = 2, contexts: Optional[Dict[str, Callable]] = None
                     ) -> Dict[str, object]:
    """Times every fn of one cell in `rounds` rounds (rotation_orders), each round a sustained
    warm-up and `reps` timed calls per fn, inside contexts[name]() if given (entered once per
    round, not per call); returns name -> summarize() over all its rounds' calls, or name -> the
    exception that stopped its timing (the others go on)."""
    times: Dict[str, List[float]] = {name: [] for name in fns}
    failed: Dict[str, BaseException] = {}
    for order in rotation_orders(list(fns), rounds):
        for name in order:
            if name in failed:
                continue
            try:
                with (contexts[name]() if contexts else contextlib.nullcontext()):
                    times[name] += timed_calls(fns[name], n_sets, reps)
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
