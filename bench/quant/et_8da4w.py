#!/usr/bin/env python3
"""ExecuTorch's 8da4w SmolLM2: torchao quantize_ + torch.export + to_edge_transform_and_lower(XnnpackPartitioner)
+ to_executorch, the route ExecuTorch's LLM export takes (outside CI; a peer for bench/quant).

    python bench/quant/et_8da4w.py --out DIR [--max-seq-len 512] [--embedding 0|4|8] [--group 32] [--weights 4|8]

Linear layers: Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, PerGroup(G)) (the tied LM head
included: quantize_ gives it its own quantized weight); with --weights 8, 8da8w: int8 weights PerAxis(0). With --embedding 4|8 the embedding table too:
IntxWeightOnlyConfig(int4 PerGroup(32) | int8 PerAxis(0)), which ExecuTorch's quant fusion
(to_executorch's do_quant_fusion_and_const_prop) turns into quantized_decomposed::embedding_4bit/byte.
Writes DIR/smollm2_et_8da4w[_e4|_e8].pte (8da8w: smollm2_et_8da8w...) and a JSON with its size and stage times.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))


def build(out: Path, max_seq_len: int, embedding: int, group: int, weights: int = 4) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from kiln_export import llm

    t0 = time.perf_counter()
    folder, fname = os.path.split(llm.smollm2_gguf())
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32,
                                                 attn_implementation=llm.ATTN_IMPLEMENTATION).eval()
    t_load = time.perf_counter() - t0

    from torchao.quantization import (Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, PerAxis, PerGroup,
                                      quantize_)

    t1 = time.perf_counter()
    if embedding:
        cfg = IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{embedding}"),
                                   granularity=PerGroup(32) if embedding == 4 else PerAxis(0))
        quantize_(model, cfg, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Embedding))
    if weights == 4:
        quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group)))
    else:  # 8da8w: int8 weights per output channel
        quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0)))
    t_quant = time.perf_counter() - t1

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    t2 = time.perf_counter()
    module = llm.make_module(model, max_seq_len, last_logits_only=False)
    ep = llm.export(module, max_seq_len, dynamic=False)
    t_export = time.perf_counter() - t2
    t3 = time.perf_counter()
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    prog = edge.to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True))
    t_lower = time.perf_counter() - t3
    name = f"smollm2_et_8da{weights}w{f'_e{embedding}' if embedding else ''}"
    out.mkdir(parents=True, exist_ok=True)
    pte = out / f"{name}.pte"
    pte.write_bytes(prog.buffer)
    ops = sorted({f"{o.name}.{o.overload}" for p in prog.executorch_program.execution_plan for o in p.operators})
    info = {"pte": str(pte), "pte_bytes": pte.stat().st_size, "embedding": embedding, "group": group, "weights": weights,
            "max_seq_len": max_seq_len, "operators": ops,
            "seconds": {"load": round(t_load, 2), "quantize": round(t_quant, 2), "export": round(t_export, 2),
                        "lower": round(t_lower, 2), "quantize_export_lower": round(t_quant + t_export + t_lower, 2)}}
    pte.with_suffix(".json").write_text(json.dumps(info, indent=2))
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--embedding", type=int, choices=(0, 4, 8), default=0)
    p.add_argument("--group", type=int, default=32, help="int4 group size (8da4w)")
    p.add_argument("--weights", type=int, choices=(4, 8), default=4, help="4: 8da4w (the default), 8: 8da8w")
    a = p.parse_args(argv)
    print(json.dumps(build(a.out, a.max_seq_len, a.embedding, a.group, a.weights), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
