"""GPT-2-small-shaped model in plain torch (the device has no transformers): export for kiln + torch eager timing."""
import json, math, os, sys, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

class Block(nn.Module):
    def __init__(s, d=768, h=12):
        super().__init__()
        s.h = h
        s.ln_1 = nn.LayerNorm(d); s.c_attn = nn.Linear(d, 3 * d); s.c_proj = nn.Linear(d, d)
        s.ln_2 = nn.LayerNorm(d); s.fc = nn.Linear(d, 4 * d); s.proj = nn.Linear(4 * d, d)
    def forward(s, x):
        b, t, d = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(d, dim=2)
        q = q.view(b, t, s.h, d // s.h).transpose(1, 2)
        k = k.view(b, t, s.h, d // s.h).transpose(1, 2)
        v = v.view(b, t, s.h, d // s.h).transpose(1, 2)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // s.h)
        r = torch.arange(t); mask = r[:, None] >= r[None, :]
        w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min))
        a = torch.matmul(w.softmax(-1), v).transpose(1, 2).reshape(b, t, d)
        x = x + s.c_proj(a)
        return x + s.proj(F.gelu(s.fc(s.ln_2(x)), approximate="tanh"))

class GPT2(nn.Module):
    def __init__(s, vocab=50257, n=12, d=768, pos=1024):
        super().__init__()
        s.wte = nn.Embedding(vocab, d); s.wpe = nn.Embedding(pos, d)
        s.h = nn.ModuleList(Block(d) for _ in range(n)); s.ln_f = nn.LayerNorm(d)
    def forward(s, ids):
        x = s.wte(ids) + s.wpe(torch.arange(ids.shape[1]))
        for b in s.h:
            x = b(x)
        return s.ln_f(x) @ s.wte.weight.t()

def main(out, seq):
    torch.manual_seed(0)
    m = GPT2().eval()
    for p in m.parameters():
        nn.init.normal_(p, std=0.02)
    ids = torch.randint(0, 50257, (1, seq))
    os.makedirs(out, exist_ok=True)
    with torch.no_grad():
        ep = torch.export.export(m, (ids,), strict=False)
        ref = m(ids)
        torch.export.save(ep, f"{out}/gpt2.pt2")
        np.save(f"{out}/in.npy", ids.numpy()); np.save(f"{out}/ref.npy", ref.numpy())
        spec = {"name": "gpt2", "exported_program": "gpt2.pt2", "ir": "default", "seq_len": seq,
                "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, seq], "reference": "in.npy"}],
                "outputs": [{"name": "logits", "dtype": "float32", "shape": list(ref.shape), "reference": "ref.npy"}]}
        json.dump(spec, open(f"{out}/model_spec.json", "w"))
        for th in (1, 2):
            torch.set_num_threads(th)
            for _ in range(3): m(ids)
            ts = []
            for _ in range(15):
                t0 = time.perf_counter(); m(ids); ts.append(time.perf_counter() - t0)
            print(f"torch eager {torch.__version__} seq {seq} threads {th}: median {1e3*sorted(ts)[len(ts)//2]:.2f} ms")

main(sys.argv[1], int(sys.argv[2]))
