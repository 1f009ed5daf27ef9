"""The implementations compared, behind one small interface (torch is imported lazily).

Every input set is created once in BSHD memory ([B, N, H, D], the layout flashcpp takes).
- flashcpp gets those tensors as they are, through `flashcpp.attention`.
- The SDPA peers (cudnn, fa2, mem_eff) and flex get the [B, H, N, D] views `.transpose(1, 2)`
  of the same memory (strides of BSHD, last dim contiguous), or with `--sdpa-layout bhsd`
  contiguous BHSD copies (the layout cuDNN's frontend prefers).
- The upstream gradient dO of the backward is given to each implementation in the layout of
  that implementation's own output (same values), so no peer pays for a layout change there.

A peer returns a callable for each mode; `fn(i)` runs the mode once on input set i. Whatever a
peer cannot do raises, and the harness records the cell as n/a with the exception's text.

Decode (bench/decode_compare.py): a `DecodeInputSet` holds a full contiguous KV cache and, per
paged layout, a shuffled page pool with the same keys and values. `FlashcppKVCachePeer` reads
either through `flashcpp.attention_with_kvcache`; the SDPA peers get the contiguous cache as an
`InputSet` (`DecodeInputSet.contiguous`) and run their `fwd`.
"""
from __future__ import annotations

import contextlib
import math
import random
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from grid import CONTIGUOUS, Case, page_size, pages_per_sequence

SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "fa2": "FLASH_ATTENTION", "mem_eff": "EFFICIENT_ATTENTION"}
ALL_IMPLS = ("flashcpp", "cudnn", "fa2", "mem_eff", "flex")
# Not in the default set: flashcpp with a deterministic backward, to time against "flashcpp";
# cuDNN's FP8 forward (bench/cudnn_fp8_peer.py, --dtype e4m3 only).
EXTRA_IMPLS = ("flashcpp_det", "flashcpp_fast", "cudnn_fp8")


class InputSet:
    """q, k, v and the upstream gradient dout, in BSHD memory."""

    def __init__(self, q, k, v, dout):
        self.q, self.k, self.v, self.dout = q, k, v, dout


def _torch_dtype(name: str):
    import torch  # noqa: PLC0415
    # e4m3 (decode): bf16 queries; make_decode_inputs stores the caches in fp8.
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
            "e4m3": torch.bfloat16}[name]


def make_input_sets(case: Case, n_sets: int, seed: int = 0) -> List[InputSet]:
    """e4m3 (the training grid's FP8 forward): q, k, v are the bf16 values rounded to
    float8_e4m3fn (unit normal values need no scaling: descales 1); dout stays bf16."""
    import torch  # noqa: PLC0415
    dtype = _torch_dtype(case.dtype)
    fp8 = case.dtype == "e4m3"
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    sets = []
    for _ in range(n_sets):
        def rnd(n, h, quantise=fp8):
            t = torch.randn(case.B, n, h, case.D, device="cuda", dtype=dtype, generator=g)
            return t.to(torch.float8_e4m3fn) if quantise else t
        sets.append(InputSet(rnd(case.Nq, case.H), rnd(case.Nk, case.Hkv), rnd(case.Nk, case.Hkv),
                             rnd(case.Nq, case.H, False)))
    return sets


class DecodeInputSet:
    """q [B, Nnew, Hq, D]; the contiguous caches k, v [B, L, Hkv, D], every sequence full
    (cache_seqlens = L, int32 on the device); paged: layout -> (k_pool, v_pool, block_table)."""

    def __init__(self, q, k, v, cache_seqlens, paged: Dict[str, tuple]):
        self.q, self.k, self.v, self.cache_seqlens, self.paged = q, k, v, cache_seqlens, paged

    def contiguous(self) -> InputSet:
        """The contiguous cache as the training peers' input set (decode has no dO)."""
        return InputSet(self.q, self.k, self.v, None)


def shuffled_page_table(batch: int, pages: int, seed) -> Tuple[List[List[int]], int]:
    """Block-table rows and the pool's page count for `batch` sequences of `pages` pages each.

    The pool holds batch x (pages + 2) pages in a random order: every sequence's pages, then
    per sequence one spare page named by an extra block-table column past its length and one
    named by nothing. The spare pages hold NaN (_page_pool), so a kernel that reads past a
    sequence's length or a page its block table does not name gives a non-finite output.
    """
    num_pages = batch * (pages + 2)
    order = list(range(num_pages))
    random.Random(seed).shuffle(order)
    width = pages + 1
    return [order[b * width:(b + 1) * width] for b in range(batch)], num_pages


def _page_pool(cache, block_table, page: int, num_pages: int):
    """cache [B, L, Hkv, D] written into a NaN-filled pool [num_pages, page, Hkv, D] at the
    pages block_table names (page p of sequence b holds its rows p * page ...)."""
    import torch  # noqa: PLC0415
    _, length, heads, dim = cache.shape
    pool = torch.full((num_pages, page, heads, dim), math.nan, dtype=cache.dtype,
                      device=cache.device)
    full, rest = divmod(length, page)
    idx = block_table.long()
    pool[idx[:, :full]] = cache[:, :full * page].unflatten(1, (full, page))
    if rest:
        pool[idx[:, full], :rest] = cache[:, full * page:]
    return pool


def make_decode_inputs(case: Case, layouts: Sequence[str], n_sets: int, seed: int = 0,
                       device: str = "cuda") -> List[DecodeInputSet]:
    """Random normal q and caches; for each paged layout a shuffled pool of the same values."""
    import torch  # noqa: PLC0415
    dtype = _torch_dtype(case.dtype)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    sets = []
    for i in range(n_sets):
        def rnd(n, h):
            return torch.randn(case.B, n, h, case.D, device=device, dtype=dtype, generator=g)
        q, k, v = rnd(case.Nq, case.H), rnd(case.Nk, case.Hkv), rnd(case.Nk, case.Hkv)
        seqlens = torch.full((case.B,), case.Nk, dtype=torch.int32, device=device)
        paged = {}
        for layout in layouts:
            page = page_size(layout)
            if not page:
                continue
            rows, num_pages = shuffled_page_table(case.B, pages_per_sequence(case.Nk, page),
                                                  f"{seed}/{i}/{layout}")
            table = torch.tensor(rows, dtype=torch.int32, device=device)
            paged[layout] = (_page_pool(k, table, page, num_pages),
                             _page_pool(v, table, page, num_pages), table)
        if case.dtype == "e4m3":  # an fp8 cache: the same values rounded to e4m3 (NaN stays NaN)
            fp8 = torch.float8_e4m3fn
            k, v = k.to(fp8), v.to(fp8)
            paged = {n: (kp.to(fp8), vp.to(fp8), t) for n, (kp, vp, t) in paged.items()}
        sets.append(DecodeInputSet(q, k, v, seqlens, paged))
    return sets


def softmax_scale(case: Case) -> float:
    return 1.0 / math.sqrt(case.D)


def _like(out, values):
    """A tensor with out's strides (empty_like preserves them) holding `values`."""
    import torch  # noqa: PLC0415
    t = torch.empty_like(out)
    t.copy_(values)
    return t


class Peer:
    """Interface. Outputs and gradients are returned as [B, H, N, D] views by `to_bhsd`."""

    name = "?"
    has_backward = True
    takes_fp8 = False  # float8_e4m3fn q, k, v with descales (sdpa_compare --dtype e4m3)
    takes_16bit = True  # bf16 / fp16 q, k, v (False: an fp8-only peer)

    def available(self) -> Optional[str]:
        """None, or why this implementation cannot run at all in this process."""
        return None

    def context(self):
        """Entered around the check and the timing of every cell of this peer."""
        return contextlib.nullcontext()

    def prepare(self, case: Case, sets: Sequence[InputSet]) -> None:
        """Per-case setup outside the timed region (block masks, layout copies)."""
        self.case, self.sets = case, sets

    def release(self) -> None:
        self.case, self.sets = None, None

    def make(self, mode: str) -> Callable[[int], object]:
        return {"fwd": self.make_fwd, "bwd": self.make_bwd, "fwd+bwd": self.make_fwd_bwd}[mode]()

    def make_fwd(self):
        raise NotImplementedError

    def make_bwd(self):
        raise NotImplementedError

    def make_fwd_bwd(self):
        raise NotImplementedError

    def to_bhsd(self, t):
        return t

    def describe(self) -> str:
        """What ran in the last call (kernel, backend), where the implementation says so."""
        return ""


class AutogradPeer(Peer):
    """Peers whose backward runs through PyTorch autograd (SDPA backends, flex)."""

    def prepare(self, case, sets):
        super().prepare(case, sets)
        self._qkv = [self._layout(s) for s in sets]

    def release(self):
        super().release()
        self._qkv = None

    def _layout(self, s: InputSet):
        views = tuple(t.transpose(1, 2) for t in (s.q, s.k, s.v))
        if self.layout == "bhsd":
            views = tuple(t.contiguous() for t in views)
        return views

    layout = "bshd-view"

    def call(self, q, k, v):
        raise NotImplementedError

    def _leaves(self, i):
        return tuple(t.detach().requires_grad_(True) for t in self._qkv[i])

    def make_fwd(self):
        import torch  # noqa: PLC0415
        qkv = self._qkv

        def fn(i):
            with torch.no_grad():
                return self.call(*qkv[i])
        return fn

    def make_bwd(self):
        import torch  # noqa: PLC0415
        state = []
        for i, s in enumerate(self.sets):
            leaves = self._leaves(i)
            out = self.call(*leaves)
            state.append((leaves, out, _like(out, s.dout.transpose(1, 2))))

        def fn(i):
            leaves, out, dout = state[i]
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)
        fn.outputs = lambda i: state[i][1]
        return fn

    def make_fwd_bwd(self):
        import torch  # noqa: PLC0415
        # dO in the layout of this peer's output, made before timing (one untimed forward)
        douts = [_like(self.call(*self._leaves(i)), s.dout.transpose(1, 2))
                 for i, s in enumerate(self.sets)]

        def fn(i):
            leaves = self._leaves(i)
            out = self.call(*leaves)
            return torch.autograd.grad(out, leaves, douts[i])
        return fn


class SdpaPeer(AutogradPeer):
    """F.scaled_dot_product_attention restricted to one backend with sdpa_kernel."""

    def __init__(self, name: str, layout: str = "bshd-view"):
        self.name, self.layout = name, layout

    def available(self):
        import torch.nn.attention as A  # noqa: PLC0415
        if not hasattr(A.SDPBackend, SDPA_BACKENDS[self.name]):
            return f"this torch has no SDPBackend.{SDPA_BACKENDS[self.name]}"
        return None

    def context(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
        return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[self.name])])

    def prepare(self, case, sets):
        super().prepare(case, sets)
        self._mask = None
        if case.causal and case.Nq != case.Nk:
            # SDPA's is_causal is top-left aligned; flashcpp's contract is bottom-right.
            from torch.nn.attention.bias import causal_lower_right  # noqa: PLC0415
            self._mask = causal_lower_right(case.Nq, case.Nk)

    def call(self, q, k, v):
        import torch.nn.functional as F  # noqa: PLC0415
        c = self.case
        gqa = {"enable_gqa": True} if c.H != c.Hkv else {}
        if self._mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self._mask,
                                                  scale=softmax_scale(c), **gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=c.causal,
                                              scale=softmax_scale(c), **gqa)


class FlexPeer(AutogradPeer):
    """torch.compile(flex_attention), causal through a block mask built once per case.

    dynamic=False: one specialised compile per shape (as a tuned deployment would do); the
    recompile limits are raised so that a long grid never falls back to eager flex.
    """

    name = "flex"

    def __init__(self, layout: str = "bshd-view"):
        self.layout = layout
        self._compiled = None

    def available(self):
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401, PLC0415
        except ImportError as e:
            return f"no flex_attention in this torch: {e}"
        return None

    def prepare(self, case, sets):
        import torch  # noqa: PLC0415
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415
        cfg = torch._dynamo.config
        for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(cfg, knob):
                setattr(cfg, knob, max(getattr(cfg, knob), 1024))
        # a fresh start per case: only this case's graphs are guarded and kept
        torch._dynamo.reset()
        self._compiled = torch.compile(flex_attention, dynamic=False)
        super().prepare(case, sets)
        self._block_mask = None
        if case.causal:
            shift = case.Nk - case.Nq

            def causal_mask(b, h, q_idx, kv_idx):
                return q_idx + shift >= kv_idx
            self._block_mask = create_block_mask(causal_mask, None, None, case.Nq, case.Nk,
                                                 device="cuda")

    def release(self):
        super().release()
        self._block_mask = None

    def call(self, q, k, v):
        c = self.case
        return self._compiled(q, k, v, block_mask=self._block_mask, scale=softmax_scale(c),
                              enable_gqa=c.H != c.Hkv)


def _split_out_lse(res):
    if isinstance(res, (tuple, list)):
        return res[0], res[1]
    return res.out, res.lse


class FlashcppPeer(Peer):
    """flashcpp.attention / flashcpp.attention_backward on the BSHD tensors themselves."""

    name = "flashcpp"
    takes_fp8 = True

    def __init__(self, backend: str = "auto"):
        self.backend = backend
        self._mod = None

    def available(self):
        try:
            import flashcpp  # noqa: PLC0415
        except Exception as e:  # noqa: BLE001 (a broken build is a reason, not a crash)
            return f"import flashcpp failed: {type(e).__name__}: {e}"
        self._mod = flashcpp
        return None

    def _kw(self):
        kw = {"causal": self.case.causal, "softmax_scale": softmax_scale(self.case),
              "backend": self.backend}
        if self.case.dtype == "e4m3":  # per-tensor descales, so their loads are timed too
            import torch  # noqa: PLC0415
            one = torch.ones(1, device="cuda")
            kw.update(q_descale=one, k_descale=one, v_descale=one)
        return kw

    def _bwd_kw(self):
        return self._kw()

    def make_fwd(self):
        att, sets, kw = self._mod.attention, self.sets, self._kw()

        def fn(i):
            s = sets[i]
            return att(s.q, s.k, s.v, **kw)
        return fn

    def make_bwd(self):
        att, sets, kw, bkw = self._mod.attention, self.sets, self._kw(), self._bwd_kw()
        bwd = self._mod.attention_backward
        state = []
        for s in sets:
            out, lse = _split_out_lse(att(s.q, s.k, s.v, return_lse=True, **kw))
            state.append((out, lse, _like(out, s.dout)))

        def fn(i):
            s = sets[i]
            out, lse, dout = state[i]
            return bwd(dout, s.q, s.k, s.v, out, lse, **bkw)
        fn.outputs = lambda i: state[i][0]
        return fn

    def make_fwd_bwd(self):
        att, sets, kw, bkw = self._mod.attention, self.sets, self._kw(), self._bwd_kw()
        bwd = self._mod.attention_backward
        # dO in the layout of flashcpp's output, made before timing (one untimed forward)
        douts = [_like(_split_out_lse(att(s.q, s.k, s.v, return_lse=True, **kw))[0], s.dout)
                 for s in sets]

        def fn(i):
            s = sets[i]
            out, lse = _split_out_lse(att(s.q, s.k, s.v, return_lse=True, **kw))
            return bwd(douts[i], s.q, s.k, s.v, out, lse, **bkw)
        return fn

    def to_bhsd(self, t):
        return t.transpose(1, 2)

    def describe(self):
        info = getattr(self._mod, "last_run_info", lambda: None)()
        return f"{info.backend} {info.kernel}" if info else ""


class FlashcppDeterministicPeer(FlashcppPeer):
    """flashcpp with deterministic=True in the backward (dq added in a fixed order)."""

    name = "flashcpp_det"

    def _bwd_kw(self):
        return {**self._kw(), "deterministic": True}


class FlashcppFastAccumPeer(FlashcppPeer):
    """flashcpp's FP8 forward with fp8_fast_accum=True (O on the tensor cores along the row, as
    FlashAttention-3 and cuDNN run FP8); --dtype e4m3 only."""

    name = "flashcpp_fast"
    takes_16bit = False

    def _kw(self):
        return {**super()._kw(), "fp8_fast_accum": True}


class FlashcppEnvPeer(FlashcppPeer):
    """flashcpp with one environment variable set around each cell (its check and its timing),
    for variables flashcpp reads at every call, e.g. FLASHCPP_SM80_FWD_TILE_D256=64x64_4w: rows
    of one run compared in one process. Named "flashcpp[value]"."""

    def __init__(self, backend: str, var: str, value: str):
        super().__init__(backend)
        self.var, self.value = var, value
        self.name = f"flashcpp[{value}]"

    @contextlib.contextmanager
    def context(self):
        import os  # noqa: PLC0415
        old = os.environ.get(self.var)
        os.environ[self.var] = self.value
        try:
            yield
        finally:
            if old is None:
                del os.environ[self.var]
            else:
                os.environ[self.var] = old


def parse_flashcpp_env(spec: str) -> Tuple[str, List[str]]:
    """'VAR=a,b' -> ('VAR', ['a', 'b']); ValueError when it is not of that form."""
    var, sep, values = spec.partition("=")
    names = [v for v in values.split(",") if v]
    if not sep or not var or not names or not var.replace("_", "").isalnum():
        raise ValueError(f"--flashcpp-env {spec!r}: expected VAR=value[,value...]")
    if len(set(names)) != len(names):
        raise ValueError(f"--flashcpp-env {spec!r}: a value is given twice")
    return var, names


class FlashcppKVCachePeer(FlashcppPeer):
    """flashcpp.attention_with_kvcache over the full caches of DecodeInputSets: the contiguous
    cache, or the page pool and block table of `layout`. Its `fwd` is the decode step."""

    has_backward = False

    def __init__(self, layout: str = CONTIGUOUS):
        super().__init__()
        self.layout = layout

    def available(self):
        why = super().available()
        if why is None and not hasattr(self._mod, "attention_with_kvcache"):
            why = "this flashcpp has no attention_with_kvcache"
        return why

    def make_fwd(self):
        att, scale = self._mod.attention_with_kvcache, softmax_scale(self.case)
        args = []
        for s in self.sets:
            if self.layout == CONTIGUOUS:
                args.append((s.q, s.k, s.v, s.cache_seqlens, None))
            else:
                k_pool, v_pool, table = s.paged[self.layout]
                args.append((s.q, k_pool, v_pool, s.cache_seqlens, table))

        def fn(i):
            q, k, v, lens, table = args[i]
            return att(q, k, v, cache_seqlens=lens, block_table=table, softmax_scale=scale)
        return fn

    def describe(self):
        info = getattr(self._mod, "last_run_info", lambda: None)()
        return f"{info.backend} {info.kernel}, {info.num_splits} splits" if info else ""


def make_peers(names: Sequence[str], sdpa_layout: str = "bshd-view",
               flashcpp_backend: str = "auto",
               flashcpp_env: Optional[Tuple[str, Sequence[str]]] = None) -> List[Peer]:
    """One peer per name; with flashcpp_env (VAR, values), a FlashcppEnvPeer per value after
    them."""
    peers: List[Peer] = []
    for n in names:
        if n == "flashcpp":
            peers.append(FlashcppPeer(flashcpp_backend))
        elif n == "flashcpp_det":
            peers.append(FlashcppDeterministicPeer(flashcpp_backend))
        elif n == "flashcpp_fast":
            peers.append(FlashcppFastAccumPeer(flashcpp_backend))
        elif n in SDPA_BACKENDS:
            peers.append(SdpaPeer(n, sdpa_layout))
        elif n == "flex":
            peers.append(FlexPeer(sdpa_layout))
        elif n == "cudnn_fp8":
            from cudnn_fp8_peer import CudnnFp8Peer  # noqa: PLC0415 (it imports this module)
            peers.append(CudnnFp8Peer())
        else:
            raise ValueError(f"unknown implementation {n!r}")
    if flashcpp_env is not None:
        var, values = flashcpp_env
        peers += [FlashcppEnvPeer(flashcpp_backend, var, v) for v in values]
    return peers


def grads_of(result) -> Tuple:
    """(dq, dk, dv) from what a backward returned (a tuple, or an object with dq/dk/dv)."""
    if isinstance(result, (tuple, list)):
        return tuple(result[:3])
    return result.dq, result.dk, result.dv
