#!/usr/bin/env python3
"""Exploratory: does rotating SmolLM2's residual stream before int4 help (issue 39)? It does not.

    .venv/bin/python bench/quality/rotation.py had|qr|none [r2]

QuaRot / SpinQuant's "R1" folded into the constants (no graph change): every RMSNorm's gamma is multiplied into the
linear layers that read it (gamma := 1), the residual stream is rotated by an orthogonal Q (the token table E Q, the
readers' weights W diag(gamma) Q, the writers' (o_proj, down_proj) Q^T W, the untied LM head W diag(gamma_final) Q);
RMSNorm without gamma is rotation-invariant, so the fp32 model is unchanged (checked: the first row is fp32's
perplexity). `had`: a randomised Hadamard matrix (576 = 12 x 48, Paley constructions, random signs); `qr`: a random
orthogonal matrix; `none`: no rotation; `r2`: also a per-head 64 x 64 Hadamard on v_proj's rows and o_proj's
columns. Then layer_error.py's weight-only fake quantization (int4 groups of 32, clipping search on bf16 scales;
int8 per channel) on the evaluation text and cached fp32 reference of quality.py (run quality.py --only fp32 first).
Measured (bench/RESULTS.md, issue 39): the rotation makes every int4 row worse, because SmolLM2's weights are a
dequantized Q4_1 GGUF, i.e. already on a 4-bit grid per group of 32 that the rotation destroys.
"""
import sys, math, time, os, hashlib
from pathlib import Path
import numpy as np, torch
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python")); sys.path.insert(0, str(REPO / "bench/quality"))
import quality
from layer_error import int4_groups, int8_channels, load_model_and_reference, score

def paley(q):
    # Paley I: q prime, q = 3 mod 4 -> Hadamard of order q+1
    sq = {(i * i) % q for i in range(1, q)}
    chi = lambda a: 0 if a % q == 0 else (1 if a % q in sq else -1)
    Qm = np.array([[chi(j - i) for j in range(q)] for i in range(q)], dtype=np.float64)
    H = np.zeros((q + 1, q + 1))
    H[0, :] = 1; H[1:, 0] = -1
    H[1:, 1:] = Qm + np.eye(q)
    assert np.allclose(H @ H.T, (q + 1) * np.eye(q + 1)), q
    return H

def sylvester(n):
    H = np.ones((1, 1))
    while H.shape[0] < n: H = np.block([[H, H], [H, -H]])
    return H

def hadamard(n):
    if n & (n - 1) == 0: return sylvester(n)
    if n == 576: return np.kron(paley(11), paley(47))
    raise ValueError(n)

def rot(n, kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "had":
        H = hadamard(n) / math.sqrt(n)
        d = rng.choice([-1.0, 1.0], n)
        Q = d[:, None] * H
    else:
        Q, R = np.linalg.qr(rng.standard_normal((n, n)))
        Q = Q * np.sign(np.diag(R))
    assert np.allclose(Q @ Q.T, np.eye(n), atol=1e-10)
    return torch.tensor(Q, dtype=torch.float64)

def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else "had"
    r2 = "r2" in sys.argv
    model, wins, ref, targets, n = load_model_and_reference(str(REPO / "artifacts" / "quality"), 512)
    emb = model.model.embed_tokens
    emb.weight = torch.nn.Parameter(emb.weight.detach().clone())
    d = model.config.hidden_size
    if kind != "none":
        Q = rot(d, kind, 0)
        with torch.no_grad():
            emb.weight.data = (emb.weight.double() @ Q).float()
            def reader(lin, g):
                lin.weight.data = ((lin.weight.double() * g.double()[None, :]) @ Q).float()
            def writer(lin):
                lin.weight.data = (Q.T @ lin.weight.double()).float()
            hd = model.config.head_dim if hasattr(model.config, "head_dim") and model.config.head_dim else d // model.config.num_attention_heads
            Qh = rot(hd, "had", 1) if r2 else None
            for L in model.model.layers:
                a, m = L.self_attn, L.mlp
                g = L.input_layernorm.weight.detach().clone(); L.input_layernorm.weight.data.fill_(1.0)
                for lin in (a.q_proj, a.k_proj, a.v_proj): reader(lin, g)
                g = L.post_attention_layernorm.weight.detach().clone(); L.post_attention_layernorm.weight.data.fill_(1.0)
                for lin in (m.gate_proj, m.up_proj): reader(lin, g)
                writer(a.o_proj); writer(m.down_proj)
                if r2:
                    wv = a.v_proj.weight.double(); nkv = wv.shape[0] // hd
                    wv = wv.reshape(nkv, hd, -1); wv = torch.einsum("ji,hjk->hik", Qh, wv)  # Qh^T per head
                    a.v_proj.weight.data = wv.reshape(nkv * hd, -1).float()
                    wo = a.o_proj.weight.double(); nq = wo.shape[1] // hd
                    wo = wo.reshape(wo.shape[0], nq, hd) @ Qh
                    a.o_proj.weight.data = wo.reshape(wo.shape[0], -1).float()
            g = model.model.norm.weight.detach().clone(); model.model.norm.weight.data.fill_(1.0)
            reader(model.lm_head, g)
    linears = {nm: m for nm, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    fp = {nm: m.weight.detach().clone() for nm, m in linears.items()}
    q4 = {nm: int4_groups(w) for nm, w in fp.items()}
    q8 = {nm: int8_channels(w) for nm, w in fp.items()}
    def evaluate(label, scheme):
        t0 = time.time()
        for nm, m in linears.items():
            m.weight.data = {"fp32": fp, "int4": q4, "int8": q8}[scheme(nm)][nm]
        ppl, kl, top1 = score(model, wins, ref, targets, n)
        print(f"{kind}{' r2' if r2 else ''}: {label}: ppl {ppl:.3f} KL {kl:.4f} top1 {100*top1:.1f}% ({time.time()-t0:.0f}s)", flush=True)
    evaluate("fp32", lambda nm: "fp32")
    evaluate("all int4", lambda nm: "int4")
    evaluate("int4, head int8", lambda nm: "int8" if nm == "lm_head" else "int4")
    evaluate("int4 blocks only (head fp32)", lambda nm: "fp32" if nm == "lm_head" else "int4")
if __name__ == "__main__":
    main()
