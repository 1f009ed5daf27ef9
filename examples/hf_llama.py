"""A small Llama-style model with random weights, run with attn_implementation "sdpa" and
"flashcpp"; prints the largest logit difference. Nothing is downloaded.

    python examples/hf_llama.py                      # CUDA bf16 when available, else CPU fp32
    python examples/hf_llama.py --device cpu --compile
"""

import argparse
import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import flashcpp
import flashcpp.transformers  # noqa: F401  registers attn_implementation="flashcpp"


def build(config: LlamaConfig, implementation: str, state, device, dtype):
    # A copy per model: the attention implementation is recorded on the config, which the
    # attention layers read at every call.
    model = LlamaForCausalLM._from_config(copy.deepcopy(config),
                                          attn_implementation=implementation)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=77)
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=512)  # head dim 32, GQA 4:1
    reference = build(config, "sdpa", None, args.device, dtype)
    candidate = build(config, "flashcpp", reference.state_dict(), args.device, dtype)

    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=args.device)
    forward_sdpa = lambda x: reference(input_ids=x).logits  # noqa: E731
    forward_flashcpp = lambda x: candidate(input_ids=x).logits  # noqa: E731
    if args.compile:
        forward_flashcpp = torch.compile(forward_flashcpp, fullgraph=True)
    with torch.no_grad():
        logits_sdpa = forward_sdpa(ids).float()
        logits_flashcpp = forward_flashcpp(ids).float()
    info = flashcpp.last_run_info()
    assert reference.config._attn_implementation == "sdpa"
    assert candidate.config._attn_implementation == "flashcpp"
    diff = (logits_sdpa - logits_flashcpp).abs().max().item()
    print(f"device={args.device} dtype={dtype} compile={args.compile} "
          f"flashcpp ran {info.backend}/{info.kernel}")
    print(f"max |logits(sdpa) - logits(flashcpp)| = {diff:.3e} "
          f"(logit scale {logits_sdpa.abs().max().item():.3f})")


if __name__ == "__main__":
    main()
