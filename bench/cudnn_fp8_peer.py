"""cuDNN's FP8 attention forward (the frontend's `sdpa_fp8` graph) as a benchmark peer.

It takes the e4m3 q, k, v of sdpa_compare's `--dtype e4m3` cases, with the per-tensor descales
flashcpp's case gets (1), through the cudnn frontend's Python package (`import cudnn`, the
nvidia-cudnn-frontend wheel: docs/benchmarking.md says how to get it onto the GPU machine).
The graph is built once per case. A build is tried in the order of `graph_attempts` (bf16 out
first, then fp16, then e4m3 out; causal as a bottom-right bound first, then as the causal
flag), and the first that cuDNN supports is timed; the reasons of those it refused are
printed, and all of them make the n/a reason when none builds. On Hopper with cuDNN 9.19 only
an e4m3 O builds (cuDNN: a 16-bit O of the FP8 forward is for Blackwell), and causal only
through the causal flag; the cell's note says what ran.

cuDNN rounds P to e4m3 before P V, like flashcpp, but multiplied by `scale_s` first (and the
product by `descale_s` after): P_SCALE is the value cuDNN's own FP8 tests use.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Dict, List, Optional

from peers import Peer, softmax_scale

# The value of cuDNN's own FP8 tests. Their model of the kernel rescales the row maximum lazily
# (P up to e^4) and quantises P x scale_s x 2^-4: at most about 218, below e4m3's 448.
P_SCALE = 64.0
MIN_CUDNN = 90100  # sdpa_fp8 needs cuDNN 9.1; the Hopper FP8 forward is older than that
WHEEL = "nvidia-cudnn-frontend"


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One way of building the graph: the output type and how causal masking is asked for."""

    out: str  # "bf16", "fp16" or "e4m3"
    mask: str  # "none"; causal: "bottom_right" (right_bound 0), "bottom_right_flag", "causal_flag"
    stats: bool = False  # also write the softmax stats (a kernel that insists on them)
    amax: bool = True  # the amax of S and O as outputs (else left to the graph, unread)

    @property
    def label(self) -> str:
        return (f"O {self.out}, mask {self.mask}" + (", with stats" if self.stats else "")
                + ("" if self.amax else ", no amax outputs"))


def graph_attempts(causal: bool, nq: int, nk: int) -> List[Attempt]:
    """The builds to try, best first: the preferred masking arguments, then the older flags.
    The plain causal flag is top-left aligned: tried only where that equals flashcpp's
    bottom-right alignment (Nq == Nk)."""
    masks = (["none"] if not causal else
             ["bottom_right", "bottom_right_flag"] + (["causal_flag"] if nq == nk else []))
    return [Attempt(out, mask, stats, amax) for out in ("bf16", "fp16", "e4m3")
            for stats in (False, True) for amax in (True, False) for mask in masks]


def backend_reason(text: str) -> str:
    """cuDNN's own words in a frontend refusal ("... the backend declined: WHY; python engines
    declined: ..."), else the text; at most 200 characters."""
    marker = "the backend declined: "
    if marker in text:
        text = text.split(marker, 1)[1].split("; python engines", 1)[0]
    return text[:200]


def _short(e: BaseException, limit: int = 300) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:limit]


class CudnnFp8Peer(Peer):
    """cuDNN FP8 SDPA forward through `cudnn.pygraph().sdpa_fp8`, run on torch's current stream."""

    name = "cudnn_fp8"
    has_backward = False
    takes_fp8 = True
    takes_16bit = False

    def __init__(self):
        self._cudnn = None
        self._handle = None
        self._built = None  # (case, _Built) of the current case
        self._last = ""

    def available(self) -> Optional[str]:
        try:
            import cudnn  # noqa: PLC0415
        except Exception as e:  # noqa: BLE001 (missing or broken: a reason, not a crash)
            return (f"no cudnn frontend Python package ({WHEEL}; docs/benchmarking.md): "
                    f"import cudnn failed: {_short(e)}")
        if not hasattr(cudnn, "pygraph"):
            return f"the module cudnn at {getattr(cudnn, '__file__', '?')} is not {WHEEL}"
        try:
            backend = int(cudnn.backend_version())
        except Exception as e:  # noqa: BLE001
            return f"cudnn.backend_version() failed (libcudnn not found?): {_short(e)}"
        if backend < MIN_CUDNN:
            return f"cuDNN {cudnn.backend_version_string()} is older than 9.1 (sdpa_fp8)"
        import torch  # noqa: PLC0415
        major, minor = torch.cuda.get_device_capability()
        if major < 9:
            return f"cuDNN's FP8 attention needs Hopper or newer (sm{major}{minor} here)"
        self._cudnn = cudnn
        print(f"  cudnn_fp8: cudnn frontend {getattr(cudnn, '__version__', '?')} "
              f"({cudnn.__file__}), cuDNN {cudnn.backend_version_string()}", flush=True)
        return None

    def _get_handle(self):
        if self._handle is None:
            self._handle = self._cudnn.create_handle()
        return self._handle

    def _set_stream(self):
        import torch  # noqa: PLC0415
        self._cudnn.set_stream(self._get_handle(), torch.cuda.current_stream().cuda_stream)

    def release(self):
        super().release()
        self._built = None

    def make_fwd(self):
        built = self._build_for_case()
        handle = self._get_handle()
        packs = [built.pack(s) for s in self.sets]
        execute, workspace = built.graph.execute, built.workspace
        self._last = built.describe

        def fn(i):
            self._set_stream()
            execute(packs[i][0], workspace, handle=handle)
            return packs[i][1]
        return fn

    def _build_for_case(self) -> "_Built":
        """The first of graph_attempts that builds and runs once on input set 0."""
        import torch  # noqa: PLC0415
        case = self.case
        if self._built is not None and self._built[0] == case:
            return self._built[1]
        self._set_stream()
        refused: Dict[str, List[str]] = {}  # reason -> the attempts it refused
        for attempt in graph_attempts(case.causal, case.Nq, case.Nk):
            try:
                built = _Built(self._cudnn, self._get_handle(), case, attempt)
                self._probe(built)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (unsupported, or an API mismatch: try the next)
                why = _short(e)
                if why not in refused:  # each reason once; the attempts it refused at the end
                    print(f"    cudnn_fp8 {case.label}: [{attempt.label}] refused: "
                          f"{_short(e, 1500)}", file=sys.stderr, flush=True)
                refused.setdefault(why, []).append(attempt.label)
                continue
            if refused:
                built.describe += (f" (after {sum(map(len, refused.values()))} refused builds; "
                                   f"the first: {backend_reason(next(iter(refused)))})")
            self._built = (case, built)
            return built
        raise RuntimeError("cuDNN built no FP8 graph: " + " | ".join(
            f"{why} [{'; '.join(labels)}]" for why, labels in refused.items()))

    def _probe(self, built: "_Built") -> None:
        """One run on input set 0, the operands as device pointers, else (where the frontend
        refuses those) as tensors; the packs of this case are then made the way that ran."""
        try:
            built.graph.execute(built.pack(self.sets[0])[0], built.workspace,
                                handle=self._get_handle())
        except Exception as e:  # noqa: BLE001
            built.as_pointers = False
            try:
                built.graph.execute(built.pack(self.sets[0])[0], built.workspace,
                                    handle=self._get_handle())
            except Exception as e2:  # noqa: BLE001
                raise RuntimeError(f"execute with pointers: {_short(e)}; with tensors: "
                                   f"{_short(e2)}") from e2
            built.describe += f" (tensors in the variant pack: pointers failed: {_short(e, 120)})"

    def to_bhsd(self, t):
        return t.transpose(1, 2)

    def describe(self):
        return self._last


class _Built:
    """One built graph of a case: the graph, its workspace, and the tensors it names."""

    def __init__(self, cudnn, handle, case, attempt: Attempt):
        import torch  # noqa: PLC0415
        self.case, self.attempt = case, attempt
        dt = cudnn.data_type
        out_dt = {"bf16": dt.BFLOAT16, "fp16": dt.HALF, "e4m3": dt.FP8_E4M3}[attempt.out]
        self.out_torch = {"bf16": torch.bfloat16, "fp16": torch.float16,
                          "e4m3": torch.float8_e4m3fn}[attempt.out]
        g = cudnn.pygraph(io_data_type=dt.FP8_E4M3, intermediate_data_type=dt.FLOAT,
                          compute_data_type=dt.FLOAT, handle=handle)
        B, H, Hkv, Nq, Nk, D = case.B, case.H, case.Hkv, case.Nq, case.Nk, case.D

        def bshd(name, n, h, dtype):  # [B, H, N, D] dims over BSHD memory
            return g.tensor(name=name, dim=[B, h, n, D], stride=[n * h * D, D, h * D, 1],
                            data_type=dtype)

        def scalar(name):
            return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dt.FLOAT)

        self.q, self.k, self.v = (bshd("q", Nq, H, dt.FP8_E4M3), bshd("k", Nk, Hkv, dt.FP8_E4M3),
                                  bshd("v", Nk, Hkv, dt.FP8_E4M3))
        names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
        self.scalars = {n: scalar(n) for n in names}
        kw = dict(self.scalars, generate_stats=attempt.stats, attn_scale=softmax_scale(case))
        if attempt.mask == "bottom_right":
            kw.update(diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, right_bound=0)
        elif attempt.mask == "bottom_right_flag":
            kw.update(use_causal_mask_bottom_right=True)
        elif attempt.mask == "causal_flag":
            kw.update(use_causal_mask=True)
        o, stats, amax_s, amax_o = g.sdpa_fp8(q=self.q, k=self.k, v=self.v, **kw)
        o.set_output(True).set_dim([B, H, Nq, D]).set_stride([Nq * H * D, D, H * D, 1])
        o.set_data_type(out_dt)
        self.o, self.stats = o, None
        self.amax = (amax_s, amax_o) if attempt.amax else ()
        for a in self.amax:
            a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1])
            a.set_data_type(dt.FLOAT)
        if attempt.stats:
            stats.set_output(True).set_dim([B, H, Nq, 1]).set_stride([H * Nq, Nq, 1, 1])
            stats.set_data_type(dt.FLOAT)
            self.stats = stats
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.graph = g
        self.workspace = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8,
                                     device="cuda")

        def value(x):
            return torch.full((1, 1, 1, 1), x, dtype=torch.float32, device="cuda")
        # descales 1 as flashcpp's case; O's scale 1 (|O| <= max |v|, far below e4m3's 448)
        self.scalar_values = {"descale_q": value(1.0), "descale_k": value(1.0),
                              "descale_v": value(1.0), "descale_s": value(1.0 / P_SCALE),
                              "scale_s": value(P_SCALE), "scale_o": value(1.0)}
        self.as_pointers = True
        self._alive: List[dict] = []
        plan = ""
        try:
            plan = g.get_plan_name_at_index(getattr(g, "_plan_index", 0))
        except Exception as e:  # noqa: BLE001 (only a label)
            plan = f"plan name unknown ({type(e).__name__})"
        # the output type first: an e4m3 O is half the bytes of flashcpp's bf16 one
        self.describe = (f"O written in {attempt.out}"
                         + (" (scale_o 1)" if attempt.out == "e4m3" else "")
                         + f", mask {attempt.mask}" + (", with stats" if attempt.stats else "")
                         + ("" if attempt.amax else ", no amax outputs")
                         + f"; cuDNN {cudnn.backend_version_string()} {plan}")

    def pack(self, s) -> tuple:
        """(variant pack, output) for input set s, the output in BSHD memory [B, Nq, H, D]
        (the layout flashcpp writes). Device pointers by default: the pack then needs nothing of
        the frontend's reading of float8 tensors; else [B, H, N, D] views with the graph's dims."""
        import torch  # noqa: PLC0415
        c = self.case
        out = torch.empty(c.B, c.Nq, c.H, c.D, dtype=self.out_torch, device="cuda")
        keep: Dict = {self.q: s.q.transpose(1, 2), self.k: s.k.transpose(1, 2),
                      self.v: s.v.transpose(1, 2), self.o: out.transpose(1, 2)}
        for a in self.amax:
            keep[a] = torch.zeros(1, 1, 1, 1, device="cuda")
        if self.stats is not None:
            keep[self.stats] = torch.empty(c.B, c.H, c.Nq, 1, device="cuda")
        for name, t in self.scalars.items():
            keep[t] = self.scalar_values[name]
        self._alive.append(keep)  # the owners of the pointers
        if not self.as_pointers:
            return keep, out
        return {t: v.data_ptr() for t, v in keep.items()}, out
