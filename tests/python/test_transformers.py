"""flashcpp.transformers: a small random Llama-style model gives the same logits with
attn_implementation="flashcpp" as with "sdpa". Skipped without transformers."""

import copy
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashcpp  # noqa: E402
from flashcpp import _native  # noqa: E402
import flashcpp.transformers  # noqa: E402,F401  registers "flashcpp"

CUDA = torch.cuda.is_available() and flashcpp.cuda_available()


def llama_pair(device, dtype):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256)
    models = {}
    state = None
    for name in ("sdpa", "flashcpp"):
        model = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config),
                                                            attn_implementation=name)
        if state is None:
            state = model.state_dict()
        else:
            model.load_state_dict(state)
        models[name] = model.to(device=device, dtype=dtype).eval()
        assert models[name].config._attn_implementation == name
    return models["sdpa"], models["flashcpp"]


def test_logits_match_sdpa_on_cpu():
    sdpa, ours = llama_pair("cpu", torch.float32)
    ids = torch.randint(0, 512, (2, 37))
    with torch.no_grad():
        expected = sdpa(input_ids=ids).logits
        got = ours(input_ids=ids).logits
        got_all_ones_mask = ours(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert flashcpp.last_run_info().backend == "cpu"
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_all_ones_mask, expected, atol=1e-4, rtol=1e-4)


def test_kv_cache_decode_matches_sdpa_on_cpu():
    # Decoding: one query against a longer key sequence, which flashcpp's bottom-right causal
    # mask covers directly.
    sdpa, ours = llama_pair("cpu", torch.float32)
    ids = torch.randint(0, 512, (1, 20))
    steps = {}
    with torch.no_grad():
        for name, model in (("sdpa", sdpa), ("flashcpp", ours)):
            prefix = model(input_ids=ids[:, :15], use_cache=True)
            cache, logits = prefix.past_key_values, []
            for t in range(15, 20):
                step = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                cache = step.past_key_values
                logits.append(step.logits)
            steps[name] = torch.cat(logits, dim=1)
    torch.testing.assert_close(steps["flashcpp"], steps["sdpa"], atol=1e-4, rtol=1e-4)


def record_calls(monkeypatch):
    """[(path, query length, RunInfo)] of every flashcpp forward ("forward") and KV-cache
    ("kvcache") launch, recorded at flashcpp._native, the one path to the native module."""
    calls = []
    for path, name in (("forward", "forward"), ("kvcache", "attention_with_kvcache")):
        def launch(q, *args, _path=path, _original=getattr(_native, name), **kwargs):
            info = _original(q, *args, **kwargs)
            calls.append((_path, q.shape[-3], info))
            return info

        monkeypatch.setattr(_native, name, launch)
    return calls


def first_divergence(got, expected):
    """(sequence, step) of the first token that differs, or None."""
    differ = (got != expected).nonzero()
    return None if len(differ) == 0 else tuple(differ[0].tolist())


GENERATE = [("cpu", torch.float32)]
if CUDA:
    GENERATE.append(("cuda", torch.bfloat16))


# Random weights give nearly flat logits: in bf16 sdpa's own top two logits are often equal
# or one rounding apart, and there either implementation's last-bit differences may pick either
# token. A token may therefore differ only where sdpa's top-2 margin is within TIE (relative to
# its top logit: two bf16 roundings); everywhere else every token must match.
TIE = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -7}


def margins(logits):
    """sdpa's relative top-2 margin per (step, sequence)."""
    top2 = torch.stack(logits).float().topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]) / top2[..., 0].abs().clamp_min(1e-6)


@pytest.mark.parametrize("device, dtype", GENERATE, ids=[d for d, _ in GENERATE])
def test_greedy_generation_matches_sdpa_through_the_kvcache_path(device, dtype, monkeypatch):
    # 64 greedy tokens: the prompt runs the forward once per layer, each of the 63 decode steps
    # the KV-cache op over transformers' DynamicCache, read in place.
    sdpa, ours = llama_pair(device, dtype)
    prompt = torch.randint(3, 512, (2, 11), device=device,
                           generator=torch.Generator(device=device).manual_seed(2))
    settings = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        reference = sdpa.generate(prompt, output_logits=True, return_dict_in_generate=True,
                                  **settings)
        calls = record_calls(monkeypatch)
        got = ours.generate(prompt, **settings)
        # The same 64 steps teacher-forced on sdpa's tokens: every step is compared, not only
        # those before a first tie.
        forced = ours(input_ids=reference.sequences[:, :11], use_cache=True)
        cache, step_logits = forced.past_key_values, [forced.logits[:, -1]]
        for t in range(11, 11 + 63):
            step = ours(input_ids=reference.sequences[:, t:t + 1], past_key_values=cache,
                        use_cache=True)
            cache = step.past_key_values
            step_logits.append(step.logits[:, -1])
    expected = reference.sequences
    assert got.shape == expected.shape == (2, 11 + 64)
    tie = margins(reference.logits) <= TIE[dtype]  # [step, sequence]
    where = first_divergence(got, expected)
    if where is not None:
        b, t = where
        assert tie[t - 11, b], f"token {t} of sequence {b} differs where sdpa has no tie"
    forced_tokens = torch.stack(step_logits).argmax(-1)  # [step, sequence]
    differ = (forced_tokens != expected[:, 11:].T) & ~tie
    assert not differ.any(), f"teacher-forced tokens differ at (step, sequence) {differ.nonzero().tolist()}"
    torch.testing.assert_close(torch.stack(step_logits).float(), torch.stack(reference.logits).float(),
                               atol=5e-2 if dtype == torch.bfloat16 else 1e-4, rtol=0)
    layers = ours.config.num_hidden_layers
    decode_calls = [(path, n) for path, n, _ in calls]
    assert decode_calls[:layers + 63 * layers] == (
        [("forward", 11)] * layers + [("kvcache", 1)] * (63 * layers))
    assert all(info.backend.startswith(device) for _, _, info in calls), calls[-1]


def left_padded_prompts(device, lengths, width):
    """Prompts of the given lengths, left-padded with token 0 to `width`, and their mask."""
    generator = torch.Generator(device=device).manual_seed(3)
    ids = torch.randint(3, 512, (len(lengths), width), device=device, generator=generator)
    mask = torch.ones_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :width - n] = 0
        mask[b, :width - n] = 0
    return ids, mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_logits_match_sdpa_on_cpu(side, monkeypatch):
    sdpa, ours = llama_pair("cpu", torch.float32)
    ids, mask = left_padded_prompts("cpu", [9, 4, 6], 9)
    if side == "right":
        ids, mask = ids.flip(1), mask.flip(1)
    calls = record_calls(monkeypatch)
    with torch.no_grad():
        expected = sdpa(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    kept = mask.bool()
    torch.testing.assert_close(got[kept], expected[kept], atol=1e-4, rtol=1e-4)
    # One varlen forward per layer over the 19 kept tokens.
    assert [(path, n) for path, n, _ in calls] == [("forward", 19)] * 2


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("device, dtype", GENERATE, ids=[d for d, _ in GENERATE])
def test_padded_batch_generate_matches_sdpa(device, dtype, cache):
    # Batched greedy generation of left-padded prompts of different lengths: the prompt runs
    # one varlen call per layer, each decode step another over the kept keys. A static cache
    # adds unused slots past the tokens seen so far.
    sdpa, ours = llama_pair(device, dtype)
    ids, mask = left_padded_prompts(device, [7, 12, 3], 12)
    settings = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    if cache == "static":
        settings["cache_implementation"] = "static"
    with torch.no_grad():
        reference = sdpa.generate(ids, attention_mask=mask, output_logits=True,
                                  return_dict_in_generate=True, **settings)
        got = ours.generate(ids, attention_mask=mask, **settings)
    expected = reference.sequences
    assert got.shape == expected.shape == (3, 12 + 24)
    where = first_divergence(got, expected)
    if where is not None:
        b, t = where
        tie = margins(reference.logits) <= TIE[dtype]
        assert tie[t - 12, b], f"token {t} of sequence {b} differs where sdpa has no tie"


def test_static_cache_without_padding_reads_the_cache_in_place(monkeypatch):
    _, ours = llama_pair("cpu", torch.float32)
    prompt = torch.randint(3, 512, (2, 5))
    calls = record_calls(monkeypatch)
    with torch.no_grad():
        ours.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                      pad_token_id=0, cache_implementation="static")
    layers = ours.config.num_hidden_layers
    assert [(path, n) for path, n, _ in calls] == (
        [("forward", 5)] * layers + [("kvcache", 1)] * (2 * layers))


def test_compiled_fullgraph_on_cpu():
    torch._dynamo.reset()
    sdpa, ours = llama_pair("cpu", torch.float32)
    ids = torch.randint(0, 512, (1, 24))
    compiled = torch.compile(lambda x: ours(input_ids=x).logits, fullgraph=True,
                             backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), sdpa(input_ids=ids).logits, atol=1e-4,
                                   rtol=1e-4)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of flashcpp")
@pytest.mark.parametrize("compile_model", [False, True], ids=["eager", "compiled"])
def test_logits_match_sdpa_on_cuda_bf16(compile_model):
    torch._dynamo.reset()
    sdpa, ours = llama_pair("cuda", torch.bfloat16)
    ids = torch.randint(0, 512, (2, 77), device="cuda")
    run = lambda x: ours(input_ids=x).logits  # noqa: E731
    if compile_model:
        run = torch.compile(run, fullgraph=True)
    with torch.no_grad():
        expected = sdpa(input_ids=ids).logits.float()
        got = run(ids).float()
    assert flashcpp.last_run_info().backend.startswith("cuda")
    # bf16 through two layers: both runs round activations to bf16 (2^-8 relative); the
    # logits agree to a few bf16 ulps of their scale.
    scale = expected.abs().max().item()
    assert (got - expected).abs().max().item() <= 4 * 2.0**-8 * max(scale, 1.0)


# ---- a training step: forward, loss, backward through torch.compile(fullgraph=True) ----------
def training_step(model, ids):
    """Loss of one causal-LM step; the caller runs backward (AOTAutograd compiles it as the
    backward graph of the compiled step)."""
    return model(input_ids=ids, labels=ids).loss


def compiled_training_grads(model, ids, backend, monkeypatch):
    """Parameter gradients of a step compiled with fullgraph=True (a graph break raises), and
    the RunInfo of every flashcpp call its backward made.

    The calls are collected by wrapping flashcpp._native._record, not read from
    last_run_info(): that is per thread, and autograd runs CUDA backward ops on a thread of its
    own."""
    runs = []

    def record(info):
        runs.append(original(info))
        return runs[-1]

    original = _native._record
    monkeypatch.setattr(_native, "_record", record)
    torch._dynamo.reset()
    model.train()
    model.zero_grad(set_to_none=True)
    step = torch.compile(training_step, fullgraph=True, backend=backend)
    loss = step(model, ids)
    forward_calls = len(runs)
    loss.backward()
    assert forward_calls == 2, f"{forward_calls} flashcpp calls in the forward (2 layers)"
    backward_runs = runs[forward_calls:]
    assert len(backward_runs) == 2, "flashcpp's backward op did not run once per layer"
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, backward_runs


def eager_training_grads(model, ids):
    model.train()
    model.zero_grad(set_to_none=True)
    loss = training_step(model, ids)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def relative_errors(grads, reference):
    """max |g - ref| / max |ref| per parameter (float64)."""
    errors = {}
    for name, ref in reference.items():
        got = grads[name]
        assert got is not None, f"{name}: no gradient"
        scale = ref.double().abs().max().item()
        errors[name] = (got.double() - ref.double()).abs().max().item() / max(scale, 1e-30)
    return errors


SLOW = os.environ.get("FLASHCPP_SLOW_TESTS") == "1"


@pytest.mark.parametrize("backend", [
    "aot_eager",
    pytest.param("inductor", marks=pytest.mark.skipif(
        not SLOW, reason="inductor compiles the training step's C++ for ~55 s on 2 cores; "
                         "FLASHCPP_SLOW_TESTS=1 runs it (the CUDA variant uses inductor)")),
])
def test_compiled_training_step_grads_match_sdpa_on_cpu(backend, monkeypatch):
    sdpa, ours = llama_pair("cpu", torch.float32)
    ids = torch.randint(0, 512, (2, 29), generator=torch.Generator().manual_seed(1))
    ref_loss, ref_grads = eager_training_grads(sdpa, ids)
    loss, grads, backward_runs = compiled_training_grads(ours, ids, backend, monkeypatch)
    assert all(run.backend == "cpu" for run in backward_runs)
    assert set(grads) == set(ref_grads)
    # fp32 on both sides; the attentions sum in different orders (tiled online softmax against
    # one softmax). Measured: 7e-7 of each parameter's largest gradient at worst (aot_eager);
    # 1e-5 leaves 14x room, while a wrong mask, scale or GQA sum is off by more than 1e-2.
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    errors = relative_errors(grads, ref_grads)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, f"{worst}: relative gradient error {errors[worst]:.3g}"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of flashcpp")
def test_compiled_training_step_grads_match_sdpa_on_cuda_bf16(monkeypatch):
    sdpa, ours = llama_pair("cuda", torch.bfloat16)
    # The yardstick: the same step in float32 with the same (bf16-rounded) weights, TF32 off.
    exact = copy.deepcopy(sdpa).float()
    ids = torch.randint(0, 512, (2, 77), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        exact_loss, exact_grads = eager_training_grads(exact, ids)
    finally:
        torch.set_float32_matmul_precision(precision)
    sdpa_loss, sdpa_grads = eager_training_grads(sdpa, ids)
    loss, grads, backward_runs = compiled_training_grads(ours, ids, "inductor", monkeypatch)
    assert all(run.backend.startswith("cuda") for run in backward_runs), backward_runs
    assert set(grads) == set(sdpa_grads) == set(exact_grads)
    # bf16 keeps 8 significant bits: every matmul output, activation and stored gradient is
    # rounded to 2^-8 relative, and the two layers' backward compounds that, so no fixed
    # tolerance against "sdpa" is both tight and safe. As the contract does for kernels, each
    # gradient's error against float32 must stay within twice that of PyTorch's bf16 "sdpa"
    # step, plus 2^-7 of the gradient's largest entry (two bf16 roundings of slack for
    # parameters where sdpa happens to land close).
    bound_loss = 2 * abs(sdpa_loss.float().item() - exact_loss.item()) + 2.0**-7 * abs(
        exact_loss.item())
    assert abs(loss.float().item() - exact_loss.item()) <= bound_loss
    ours_err = relative_errors(grads, exact_grads)
    sdpa_err = relative_errors(sdpa_grads, exact_grads)
    bad = {n: (ours_err[n], sdpa_err[n]) for n in exact_grads
           if not ours_err[n] <= 2 * sdpa_err[n] + 2.0**-7}
    assert not bad, "gradients outside the bf16 criterion (flashcpp err, sdpa err): " + ", ".join(
        f"{n} {o:.3g} vs {s:.3g}" for n, (o, s) in sorted(bad.items()))
