#!/usr/bin/env python3
"""Exploratory: does GPTQ's damping decide whether it generalises on a short calibration text? One SmolLM2 layer's
down_proj and q_proj (every 4th row), H from the 840-token calibration text (artifacts/quality/calibration.txt,
written by quality.py) and from 1,024 held-out tokens of founding_documents.txt (eager activations), numpy GPTQ
(groups of 32, a clipping-ratio scale search per group when it starts) against plain rounding, objective
sum (w - q) H (w - q)^T on both. Usage: .venv/bin/python bench/quality/gptq_damping.py [LAYER]"""
import os, sys, numpy as np, torch
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(REPO, "python"))
from kiln_export import llm
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, fname = os.path.split(llm.smollm2_gguf())
tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32).eval()
cal = open(os.path.join(REPO, "artifacts/quality/calibration.txt")).read()
ev = open(os.path.join(REPO, "bench/quality/founding_documents.txt")).read()
L = int(sys.argv[1]) if len(sys.argv) > 1 else 15
layers = {"down": model.model.layers[L].mlp.down_proj, "q": model.model.layers[L].self_attn.q_proj}
acts = {k: [] for k in layers}
hooks = [m.register_forward_pre_hook(lambda m, a, k=k: acts[k].append(a[0].reshape(-1, a[0].shape[-1]).double().numpy())) for k, m in layers.items()]
def run(text, n):
    for k in acts: acts[k].clear()
    ids = tok(text, add_special_tokens=False)["input_ids"][:n]
    with torch.no_grad():
        for i in range(0, len(ids), 512): model(torch.tensor([ids[i:i+512]]))
    return {k: np.concatenate(v) for k, v in acts.items()}
Xc = run(cal, 840); Xe = run(ev, 1024)
def qgroup(v):  # best bf16-free scale over clip ratios, symmetric [-8,7]
    a = np.abs(v).max()
    if a == 0: return 1.0
    best, bs = None, a / 7.5
    for r in [7, 8, 8.5, 9, 10, 11, 7.5]:
        s = a / r; q = np.clip(np.rint(v / s), -8, 7); s2 = (v @ q) / max(q @ q, 1e-30)
        for sc in (s, s2):
            if sc <= 0: continue
            e = ((v - sc * np.clip(np.rint(v / sc), -8, 7)) ** 2).sum()
            if best is None or e < best: best, bs = e, sc
    return bs
def rtn(W):
    Q = np.empty_like(W)
    for r in range(W.shape[0]):
        for g in range(0, W.shape[1], 32):
            s = qgroup(W[r, g:g+32]); Q[r, g:g+32] = s * np.clip(np.rint(W[r, g:g+32] / s), -8, 7)
    return Q
def gptq(W, H, damp):
    k = H.shape[0]; H = H.copy(); H[np.diag_indices(k)] += damp * np.mean(np.diag(H))
    U = np.linalg.cholesky(np.linalg.inv(H)).T
    W = W.copy(); Q = np.zeros_like(W); S = np.zeros(W.shape[0])
    for i in range(k):
        if i % 32 == 0: S = np.array([qgroup(W[r, i:i+32]) for r in range(W.shape[0])])
        q = S * np.clip(np.rint(W[:, i] / S), -8, 7); Q[:, i] = q
        e = (W[:, i] - q) / U[i, i]; W[:, i+1:] -= np.outer(e, U[i, i+1:])
    return Q
for k, m in layers.items():
    W = m.weight.detach().double().numpy()
    rows = np.arange(0, W.shape[0], 4); W = W[rows]
    H = Xc[k].T @ Xc[k] / len(Xc[k])
    He = Xe[k].T @ Xe[k] / len(Xe[k])
    obj = lambda Q, HH: float(np.einsum("ri,ij,rj->", W - Q, HH, W - Q))
    R = rtn(W)
    print(f"layer {L} {k} (k={W.shape[1]}, rank H cal {np.linalg.matrix_rank(H)}): RTN cal {obj(R,H):.4g} eval {obj(R,He):.4g}", flush=True)
    for d in [0.01, 0.1, 1.0]:
        G = gptq(W, H, d)
        print(f"  damp {d}: GPTQ cal {obj(G,H):.4g} eval {obj(G,He):.4g}", flush=True)
