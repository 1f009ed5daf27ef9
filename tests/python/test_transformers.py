"""flashcpp.transformers: a small random Llama-style model gives the same logits with
attn_implementation="flashcpp" as with "sdpa". Skipped without transformers."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashcpp  # noqa: E402
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


def test_padding_mask_is_refused():
    _, ours = llama_pair("cpu", torch.float32)
    ids = torch.randint(0, 512, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="padding masks are not supported"):
        ours(input_ids=ids, attention_mask=mask)


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
