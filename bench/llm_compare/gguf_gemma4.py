#!/usr/bin/env python3
"""A Gemma 4 text model's weights (transformers' Gemma4ForCausalLM names) written as a GGUF file llama.cpp loads
(its "gemma4" architecture: per-layer embeddings, KV-shared layers, sliding/global attention), and quantized with
llama.cpp's own quantizer: the peer's side of the "same weights" comparison for E2B (issue 38, item 6).

    .venv/bin/python bench/llm_compare/gguf_gemma4.py SPEC.json OUT_DIR [--types bf16,q4_0,q4_k_m] [--check N]
        [--keep-bf16]

SPEC.json is the model_spec.json of `python -m kiln_export llm --arch gemma4 --config e2b` (seeded weights).
The weights are read from its .pt2 without loading it: the archive's weight records are stored uncompressed, so
each tensor is a read-only memory map of the .pt2 file (E2B's 9.3 GB of bf16 stay on disk; torch.export.load
would copy them into memory). Writes OUT_DIR/<name>.bf16.gguf (bf16 matrices and tables, f32 norms and layer
scalars), then OUT_DIR/<name>.<type>.gguf for each quantized type (llama_cpp.llama_model_quantize, i.e.
llama.cpp's llama-quantize), then removes the bf16 GGUF (9 GB for E2B) unless --keep-bf16.
--check N (before quantizing): the bf16 GGUF's logits against transformers' eager Gemma4ForCausalLM in fp32 on
the same weights (each bf16 weight widened exactly when a layer runs, so the fp32 model never sits in memory at
once), for N tokens each at position 0 (exits 1 when they agree poorly) and for one sequence of the N tokens (its
agreement per position reported).

Layout (as llama.cpp's conversion/gemma.py Gemma4Model writes a Gemma4ForCausalLM): transformers' names mapped by
gguf's own tensor-name map for MODEL_ARCH.GEMMA4 (layer_scalar -> blk.N.layer_output_scale), no row permutation
(Gemma's rotary layout is GGML's NEOX one), norms as they are (Gemma 4's RMSNorm multiplies by the weight, no
+1 shift); the tied LM head is not written (llama.cpp reads token_embd); a rope_freqs tensor for the global
layers' "proportional" RoPE (frequency factor 1 for the rotated pairs, 1e30 for the rest). The feed-forward
length per layer is read from the weights (E2B's KV-shared layers have double-wide MLPs). The tokenizer is the
stand-in of gguf_llama.py (byte tokens, then placeholders): the benchmark feeds token ids, never text.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_llama import FTYPES, compare, quantize  # noqa: E402  (llama.cpp's ftype ids, the logit comparison)


# --- the .pt2's weights as memory maps ---------------------------------------------------------------------------

def pt2_weights(pt2: Path) -> dict:
    """fqn -> torch tensor (read-only memory map of the archive) for every parameter and persistent buffer of a
    .pt2 written by torch.export.save or kiln_export's pt2_writer (stored zip records, raw storage bytes)."""
    import torch
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    z = zipfile.ZipFile(pt2)
    cfg_name = next(n for n in z.namelist() if n.endswith("data/weights/model_weights_config.json"))
    root = cfg_name[: -len("model_weights_config.json")]
    config = json.loads(z.read(cfg_name))["config"]
    out = {}
    with open(pt2, "rb") as f:
        for fqn, meta in config.items():
            if meta.get("use_pickle"):
                raise ValueError(f"{pt2}: {fqn} is a pickled tensor (a tensor subclass): not a plain weight")
            info = z.getinfo(root + meta["path_name"])
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{pt2}: {info.filename} is compressed")
            f.seek(info.header_offset)
            header = f.read(30)
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            tm = meta["tensor_meta"]
            dtype = _SERIALIZE_TO_TORCH_DTYPE[tm["dtype"]]
            sizes = [s["as_int"] for s in tm["sizes"]]
            strides = [s["as_int"] for s in tm["strides"]]
            offset = tm["storage_offset"]["as_int"]
            itemsize = torch.empty((), dtype=dtype).element_size()
            n = info.file_size // itemsize
            raw = np.memmap(pt2, dtype=np.uint8, mode="r", offset=start, shape=(n * itemsize,))
            with warnings.catch_warnings():  # a read-only map: nothing writes to these tensors
                warnings.simplefilter("ignore")
                storage = torch.from_numpy(raw).view(dtype)
            out[fqn] = storage.as_strided(sizes, strides, offset)
    return out


def hf_names(state_dict: dict) -> dict:
    """transformers' Gemma4ForCausalLM names (model.*, lm_head.*) from a state dict with or without the export
    wrapper's `model.` prefix."""
    out = {}
    for k, v in state_dict.items():
        if k.startswith("model.model.") or k.startswith("model.lm_head."):
            k = k[len("model."):]
        out[k] = v
    return out


# --- the GGUF file -----------------------------------------------------------------------------------------------

def gguf_tensors(sd: dict, cfg):
    """(gguf name, torch tensor) in llama.cpp's gemma4 layout, from transformers' names (hf_names)."""
    import gguf

    n_layers = cfg.num_hidden_layers
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, n_layers)
    tied = sd.get("lm_head.weight") is None or cfg.tie_word_embeddings
    for k, t in sd.items():
        if k == "lm_head.weight" and tied:
            continue
        name = k + ".weight" if k.endswith("layer_scalar") else k
        gname = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise ValueError(f"gguf_gemma4: no GGUF name for {k}")
        yield gname, t


def rope_freqs(cfg):
    """The global layers' proportional RoPE as llama.cpp's converter writes it: head_dim/2 frequency factors, 1
    for the partial_rotary_factor share of the pairs, 1e30 (no rotation) for the rest."""
    full = cfg.rope_parameters["full_attention"]
    if full.get("rope_type") != "proportional":
        raise ValueError(f"gguf_gemma4: global layers' rope_type {full.get('rope_type')}, expected proportional")
    head_dim = global_head_dim(cfg)
    n_rot = int(head_dim * full["partial_rotary_factor"] / 2)
    return np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), dtype=np.float32)


def global_head_dim(cfg) -> int:
    return next(cfg.per_layer_config[i].head_dim for i, t in enumerate(cfg.layer_types) if t == "full_attention")


def write_gguf(state_dict: dict, cfg, path, name: str = "gemma4") -> None:
    """Writes the weights as a gemma4-architecture GGUF: bf16 (or f16/f32: as stored) matrices and embedding
    tables, f32 norms and layer scalars."""
    import gguf
    import torch

    sd = hf_names(state_dict)
    n_layers = cfg.num_hidden_layers
    types = cfg.layer_types
    sliding = [t == "sliding_attention" for t in types]
    lc = cfg.per_layer_config
    swa_head = next(lc[i].head_dim for i in range(n_layers) if sliding[i])
    full_head = global_head_dim(cfg)
    kv_heads = {lc[i].num_key_value_heads for i in range(n_layers)}
    if len(kv_heads) != 1:
        raise ValueError(f"gguf_gemma4: KV head counts {sorted(kv_heads)} differ by layer (not written yet)")
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_name(name)
    w.add_block_count(n_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length([int(sd[f"model.layers.{i}.mlp.gate_proj.weight"].shape[0]) for i in range(n_layers)])
    w.add_head_count(lc[0].num_attention_heads)
    w.add_head_count_kv(kv_heads.pop())
    w.add_key_length(full_head)
    w.add_value_length(full_head)
    w.add_key_length_swa(swa_head)
    w.add_value_length_swa(swa_head)
    rp = cfg.rope_parameters
    w.add_rope_dimension_count(full_head)  # proportional RoPE: all pairs, the unrotated ones by rope_freqs
    w.add_rope_dimension_count_swa(int(swa_head * rp["sliding_attention"].get("partial_rotary_factor", 1.0)))
    w.add_rope_freq_base(float(rp["full_attention"]["rope_theta"]))
    w.add_rope_freq_base_swa(float(rp["sliding_attention"]["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(float(cfg.final_logit_softcapping))
    w.add_sliding_window(cfg.sliding_window)
    w.add_sliding_window_pattern(sliding)
    w.add_shared_kv_layers(cfg.num_kv_shared_layers)
    w.add_embedding_length_per_layer_input(cfg.hidden_size_per_layer_input or 0)
    w.add_vocab_size(cfg.vocab_size)
    dtype = sd["model.embed_tokens.weight"].dtype
    w.add_file_type({torch.bfloat16: gguf.LlamaFileType.MOSTLY_BF16, torch.float16: gguf.LlamaFileType.MOSTLY_F16}
                    .get(dtype, gguf.LlamaFileType.ALL_F32))
    n = cfg.vocab_size
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<0x{i:02X}>" if i < 256 else f"<t{i}>" for i in range(n)])
    w.add_token_scores([0.0] * n)
    w.add_token_types([gguf.TokenType.BYTE if i < 256 else gguf.TokenType.NORMAL for i in range(n)])
    w.add_bos_token_id(cfg.bos_token_id if cfg.bos_token_id is not None and cfg.bos_token_id < n else 1)
    w.add_eos_token_id(cfg.eos_token_id if isinstance(cfg.eos_token_id, int) and cfg.eos_token_id < n else 2)
    w.add_add_bos_token(False)
    w.add_tensor("rope_freqs.weight", rope_freqs(cfg))
    for gname, t in gguf_tensors(sd, cfg):
        t = t.detach()
        if t.dim() <= 1:  # norms, layer scalars: f32, as llama.cpp's converter writes them
            w.add_tensor(gname, t.float().reshape(-1).numpy())
        elif t.dtype == torch.float32:
            w.add_tensor(gname, t.contiguous().numpy())
        elif t.dtype == torch.bfloat16:
            w.add_tensor(gname, t.contiguous().view(torch.int16).numpy().view(np.uint16),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
        elif t.dtype == torch.float16:
            w.add_tensor(gname, t.contiguous().numpy())
        else:
            raise ValueError(f"{gname}: unsupported dtype {t.dtype}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --- the oracle: transformers' eager in fp32, weights widened per call -------------------------------------------

def eager_logits(state_dict: dict, cfg, tokens: list[int], chunk_rows: int = 32768, separate: bool = False
                 ) -> np.ndarray:
    """transformers' eager Gemma4ForCausalLM in fp32 on the weights of `state_dict` (bf16 ones widened exactly).
    The linear and embedding weights stay as given (e.g. memory maps): each linear widens its weight to fp32 when
    it runs (the vocabulary-sized LM head in row chunks), each embedding widens the rows it looks up; everything
    else (norms, layer scalars, embedding scales, RoPE tables) is the fp32 model's own, the norms and scalars
    loaded from `state_dict`. separate: each token a sequence of its own (position 0), not one sequence."""
    import torch
    import torch.nn.functional as F
    from transformers import Gemma4ForCausalLM

    sd = hf_names(state_dict)
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        model = Gemma4ForCausalLM._from_config(cfg, dtype=torch.float32)
    big = (torch.nn.Linear, torch.nn.Embedding)
    for m in model.modules():
        if not isinstance(m, big):
            m.to_empty(device="cpu", recurse=False)
            model._init_weights(m)
    for fqn, p in list(model.named_parameters()) + list(model.named_buffers()):
        mod_name, _, leaf = fqn.rpartition(".")
        mod = model.get_submodule(mod_name)
        if isinstance(mod, big):
            continue
        if fqn not in sd:
            if isinstance(p, torch.nn.Parameter):
                raise KeyError(f"eager_logits: {fqn} is not in the weights")
            continue  # a buffer the model computes (RoPE frequencies)
        with torch.no_grad():
            p.copy_(sd[fqn].float().reshape(p.shape))

    def linear_forward(weight):
        def fwd(x):
            if weight.shape[0] <= chunk_rows:
                return F.linear(x, weight.float())
            return torch.cat([F.linear(x, weight[i:i + chunk_rows].float())
                              for i in range(0, weight.shape[0], chunk_rows)], dim=-1)
        return fwd

    for fqn, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            key = fqn + ".weight"
            weight = sd.get(key)
            if weight is None and fqn == "lm_head" and cfg.tie_word_embeddings:
                weight = sd["model.embed_tokens.weight"]
            if m.bias is not None:
                raise NotImplementedError(f"{fqn}: a linear with a bias")
            m.forward = linear_forward(weight)
            del m.weight
        elif isinstance(m, torch.nn.Embedding):
            weight = sd[fqn + ".weight"]
            scale = getattr(m, "embed_scale", None)
            scale = float(m.scalar_embed_scale) if scale is not None else 1.0
            m.forward = (lambda wt, s: lambda ids: F.embedding(ids, wt).float() * torch.tensor(s, dtype=torch.float32)
                         )(weight, scale)
            del m.weight
    model.eval()
    with torch.no_grad():
        if separate:
            return model(torch.tensor(tokens).unsqueeze(1), use_cache=False).logits[:, 0].float().numpy()
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()


def llama_cpp_logits(path, tokens: list[int], threads: int = 2, separate: bool = False) -> np.ndarray:
    """llama.cpp's logits for every position of `tokens` (one batch from position 0); separate: each token a
    sequence of its own (the cache cleared before each)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(len(tokens), 16), n_batch=len(tokens),
                          n_ubatch=len(tokens), n_threads=threads, n_threads_batch=threads, logits_all=True,
                          verbose=False)
    if separate:
        rows = []
        for t in tokens:
            llm.reset()
            llm.eval([t])
            rows.append(np.array(llm.scores[0], dtype=np.float32))
        out = np.stack(rows)
    else:
        llm.eval(tokens)
        out = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    llm.close()
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b)]


def load_spec(spec_path: Path):
    """(weights of the spec's .pt2 as memory maps, transformers config, name)."""
    spec = json.loads(spec_path.read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    from kiln_export import gemma4

    if spec["llm"]["arch"] != "gemma4":
        raise SystemExit(f"gguf_gemma4: {spec_path}: arch {spec['llm']['arch']}, expected gemma4")
    cfg = gemma4.config(spec["config"])
    sd = pt2_weights(spec_path.parent / spec["exported_program"])
    return sd, cfg, spec["name"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("out_dir")
    ap.add_argument("--types", default="bf16,q4_0,q4_k_m")
    ap.add_argument("--check", type=int, default=0, help="compare the bf16 GGUF's logits on N tokens with eager")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-bf16", action="store_true", help="keep the bf16 GGUF after quantizing")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd, cfg, name = load_spec(Path(args.spec))
    src = out / f"{name}.bf16.gguf"
    quantized = {q: out / f"{name}.{q}.gguf" for q in args.types.split(",") if q != "bf16"}
    report = {}
    need_src = args.check or any(not p.exists() for p in quantized.values())
    if need_src and not src.exists():
        tmp = src.with_suffix(".tmp")
        write_gguf(sd, cfg, tmp, name)
        tmp.rename(src)
        print(f"gguf_gemma4: wrote {src} ({src.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    if args.check:
        # two checks: N tokens each at position 0 (every weight but attention's mixing, N rows of each table), the
        # pass criterion; and one sequence of the N tokens, reported per position: on E2B's random weights the
        # positions after 0 amplify any rounding (bench/RESULTS.md: kiln ~ ExecuTorch cosine 0.9996 at position 0,
        # 0.86 by position 11), and llama.cpp rounds activations to bf16 for its bf16 products
        rng = np.random.default_rng(0)
        tokens = [int(t) for t in rng.integers(0, cfg.vocab_size, args.check)]
        got = llama_cpp_logits(src, tokens, args.threads, separate=True)
        ref = eager_logits(sd, cfg, tokens, separate=True)
        got_seq = llama_cpp_logits(src, tokens, args.threads)
        ref_seq = eager_logits(sd, cfg, tokens)
        report["check"] = {"tokens": tokens, **compare(got, ref),
                           "sequence": {**compare(got_seq, ref_seq), "cosine_per_position": cosines(got_seq, ref_seq)}}
        print(f"gguf_gemma4: check {json.dumps(report['check'])}", file=sys.stderr)
    for q, dst in quantized.items():
        if not dst.exists():
            tmp = dst.with_suffix(".tmp")
            quantize(src, tmp, q, args.threads)
            tmp.rename(dst)
            print(f"gguf_gemma4: quantized {dst} ({dst.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
        report[q] = str(dst)
    if src.exists() and not args.keep_bf16 and quantized:
        src.unlink()
        print(f"gguf_gemma4: removed {src} (--keep-bf16 keeps it)", file=sys.stderr)
    elif src.exists():
        report["bf16"] = str(src)
    print(json.dumps(report))
    c = report.get("check")
    if c and (c["min_cosine"] < 0.999 or c["max_diff_over_std"] > 0.1
              or c["argmax_disagree_ref_margin"] > c["max_abs_diff"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
