#!/usr/bin/env python3
"""A Llama model's weights (transformers' names) written as a GGUF file llama.cpp loads, and quantized with
llama.cpp's own quantizer: the peer's side of the "same weights" comparison (issue 38, item 6).

    .venv/bin/python bench/llm_compare/gguf_llama.py SPEC.json OUT_DIR [--types bf16,q4_0,q4_k_m] [--check N]

SPEC.json is the model_spec.json of `python -m kiln_export llm --arch llama` (seeded weights); the weights are
read from its .pt2 (torch.export.load), so the GGUF holds exactly the tensors kiln lowers. Writes
OUT_DIR/<name>.bf16.gguf (the weights as they are: bf16 matrices, f32 norms; fp32 models are written f32)
and OUT_DIR/<name>.<type>.gguf for each quantized type (llama_cpp.llama_model_quantize, i.e. llama.cpp's
llama-quantize). --check N: the bf16 GGUF's logits for N tokens (llama.cpp, one batch) against transformers'
eager fp32 on the same weights; prints the agreement and exits 1 when the argmax differs or the error is large.

Layout (as llama.cpp's convert_hf_to_gguf.py writes a LlamaForCausalLM): q_proj and k_proj rows permuted
from transformers' split-half rotary layout to GGML's interleaved pairs (per head: reshape (2, head_dim/2)
and swap, k with the kv head count); a tied LM head is not written (llama.cpp reads token_embd). The
tokenizer is a stand-in (SentencePiece-style "llama" vocabulary: 256 byte tokens, then placeholders) of the
model's vocabulary size: the benchmark feeds token ids, never text.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# llama_ftype values (llama.h): the targets of llama_model_quantize
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q4_k_m": 15, "q4_k_s": 14, "q5_k_m": 17, "q6_k": 18}
NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def permute_rows(w, n_head: int):
    """transformers' rotary layout (per head: first half, second half) to GGML's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_tensors(state_dict: dict, cfg):
    """(gguf name, torch tensor) in llama.cpp's layout, from transformers' LlamaForCausalLM state dict (names
    with or without a wrapper prefix before `model.` / `lm_head.`)."""
    sd = {}
    for k, v in state_dict.items():
        i = k.find("model.layers.") if "model.layers." in k else max(k.find("model.embed_tokens"), k.find("model.norm"),
                                                                       k.find("lm_head."))
        if i >= 0:
            sd[k[i:]] = v
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    yield "token_embd.weight", sd["model.embed_tokens.weight"]
    for b in range(cfg.num_hidden_layers):
        for hf, gg in NAMES.items():
            w = sd[f"model.layers.{b}.{hf}.weight"]
            if gg == "attn_q":
                w = permute_rows(w, n_head)
            elif gg == "attn_k":
                w = permute_rows(w, n_kv)
            yield f"blk.{b}.{gg}.weight", w
    yield "output_norm.weight", sd["model.norm.weight"]
    head = sd.get("lm_head.weight")
    if not cfg.tie_word_embeddings and head is not None:
        yield "output.weight", head


def write_gguf(state_dict: dict, cfg, path, name: str = "llama") -> None:
    """Writes the weights as a llama-architecture GGUF: bf16 (or f16/f32: as stored) matrices, f32 norms."""
    import gguf
    import torch

    w = gguf.GGUFWriter(str(path), "llama")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.rope_theta if getattr(cfg, "rope_theta", None) is not None
                               else cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    dtype = state_dict_dtype(state_dict)
    w.add_file_type({torch.bfloat16: gguf.LlamaFileType.MOSTLY_BF16, torch.float16: gguf.LlamaFileType.MOSTLY_F16}
                    .get(dtype, gguf.LlamaFileType.ALL_F32))
    n = cfg.vocab_size
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<0x{i:02X}>" if i < 256 else f"<t{i}>" for i in range(n)])
    w.add_token_scores([0.0] * n)
    w.add_token_types([gguf.TokenType.BYTE if i < 256 else gguf.TokenType.NORMAL for i in range(n)])
    bos = cfg.bos_token_id if cfg.bos_token_id is not None and cfg.bos_token_id < n else 1
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) and cfg.eos_token_id < n else 2
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    for gname, t in gguf_tensors(state_dict, cfg):
        t = t.detach().contiguous()
        if t.dim() == 1 or t.dtype == torch.float32:  # norms: f32, as llama.cpp's converter writes them
            w.add_tensor(gname, t.float().numpy())
        elif t.dtype == torch.bfloat16:
            w.add_tensor(gname, t.view(torch.int16).numpy().view(np.uint16), raw_dtype=gguf.GGMLQuantizationType.BF16)
        elif t.dtype == torch.float16:
            w.add_tensor(gname, t.numpy())
        else:
            raise ValueError(f"{gname}: unsupported dtype {t.dtype}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def state_dict_dtype(state_dict: dict):
    import torch

    for t in state_dict.values():
        if t.dim() == 2:
            return t.dtype
    return torch.float32


def quantize(src, dst, qtype: str, threads: int = 2, imatrix: dict | None = None) -> None:
    """llama.cpp's quantizer (llama-quantize's library call) from the bf16/f16/f32 GGUF to `qtype`. `imatrix`: GGUF
    tensor name -> importance per input column (llama-imatrix's in_sum2 / counts: the mean x^2 of the tensor's
    inputs), handed over as llama-quantize hands a loaded imatrix file (a null-terminated array)."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[qtype]
    params.nthread = threads
    if imatrix:
        keep = [(name.encode(), np.ascontiguousarray(v, dtype=np.float32)) for name, v in imatrix.items()]
        entries = (llama_cpp.llama_model_imatrix_data * (len(keep) + 1))()
        for e, (name, v) in zip(entries, keep):
            e.name, e.data, e.size = name, v.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), v.size
        entries[len(keep)].name = None  # the terminator
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {qtype}) returned {rc}")


def llama_cpp_logits(path, tokens: list[int], threads: int = 2) -> np.ndarray:
    """llama.cpp's logits for every position of `tokens` (one batch from position 0)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(len(tokens), 8), n_batch=len(tokens),
                          n_ubatch=len(tokens), n_threads=threads, n_threads_batch=threads, logits_all=True,
                          verbose=False)
    llm.eval(tokens)
    out = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    llm.close()
    return out


def eager_logits(state_dict: dict, cfg, tokens: list[int]) -> np.ndarray:
    """transformers' eager LlamaForCausalLM in fp32 on the same weights (widened exactly from bf16)."""
    import torch
    from transformers import LlamaForCausalLM

    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    sd = {}
    for k, v in state_dict.items():
        for prefix in ("model.layers.", "model.embed_tokens", "model.norm", "lm_head."):
            i = k.find(prefix)
            if i >= 0:
                sd[k[i:]] = v.float()
                break
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    model.load_state_dict(sd, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg)  # its inv_freq buffer, off the meta device
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """Agreement of two logit arrays [positions, vocab]: max |diff| relative to the reference's spread, the
    smallest per-position cosine similarity, argmax agreement."""
    rel = float(np.abs(a - b).max() / (b.std() + 1e-12))
    cos = float(min(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)) for x, y in zip(a, b)))
    # where the argmaxes differ: the reference's margin between its top token and the other's (a near-tie when
    # it is below the logits' max |diff|)
    gaps = [float(y[y.argmax()] - y[x.argmax()]) for x, y in zip(a, b) if x.argmax() != y.argmax()]
    return {"max_abs_diff": float(np.abs(a - b).max()), "ref_std": float(b.std()), "max_diff_over_std": rel,
            "min_cosine": cos, "argmax_agree": int((a.argmax(-1) == b.argmax(-1)).sum()), "positions": len(a),
            "argmax_disagree_ref_margin": max(gaps) if gaps else 0.0}


def load_spec(spec_path: Path):
    """(state dict from the spec's .pt2, transformers config, name)."""
    import torch

    spec = json.loads(spec_path.read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    from kiln_export.llm import tiny_config

    if spec["llm"]["arch"] != "llama":
        raise SystemExit(f"gguf_llama: {spec_path}: arch {spec['llm']['arch']}, expected llama")
    cfg = tiny_config("llama", spec["config"])
    ep = torch.export.load(str(spec_path.parent / spec["exported_program"]))
    sd = dict(ep.state_dict)
    del ep
    return sd, cfg, spec["name"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("out_dir")
    ap.add_argument("--types", default="bf16,q4_0,q4_k_m")
    ap.add_argument("--check", type=int, default=0, help="compare the bf16 GGUF's logits on N tokens with eager")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd, cfg, name = load_spec(Path(args.spec))
    src = out / f"{name}.bf16.gguf"
    if not src.exists():
        tmp = src.with_suffix(".tmp")
        write_gguf(sd, cfg, tmp, name)
        tmp.rename(src)
        print(f"gguf_llama: wrote {src} ({src.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    report = {"bf16": str(src)}
    for q in args.types.split(","):
        if q == "bf16":
            continue
        dst = out / f"{name}.{q}.gguf"
        if not dst.exists():
            tmp = dst.with_suffix(".tmp")
            quantize(src, tmp, q, args.threads)
            tmp.rename(dst)
            print(f"gguf_llama: quantized {dst} ({dst.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
        report[q] = str(dst)
    if args.check:
        rng = np.random.default_rng(0)
        tokens = [int(t) for t in rng.integers(0, cfg.vocab_size, args.check)]
        ref = eager_logits(sd, cfg, tokens)
        got = llama_cpp_logits(src, tokens, args.threads)
        report["check"] = {"tokens": tokens, **compare(got, ref)}
    print(json.dumps(report))
    c = report.get("check")
    if c and (c["min_cosine"] < 0.999 or c["max_diff_over_std"] > 0.1
              or c["argmax_disagree_ref_margin"] > c["max_abs_diff"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
