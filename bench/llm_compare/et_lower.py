"""ExecuTorch's own .pte of an LLM .pt2 from `python -m kiln_export llm`: to_edge_transform_and_lower
with XnnpackPartitioner, the constant methods its LLM runner reads (from model_spec.json), written
to OUT.tmp then renamed.

    .venv/bin/python bench/llm_compare/et_lower.py MODEL_SPEC.json OUT.pte [8da4w:G]

A spec of a `--dynamic` export (T from 1 to max_seq_len) gives a dynamic program either way.
With 8da4w:G the program is ExecuTorch's 8da4w instead: the same wrapper module (python -m kiln_export
llm, SmolLM2's weights, a cache of the spec's max_seq_len) quantized by torchao
(quantize_(Int8DynamicActivationIntxWeightConfig(int4, PerGroup(G)))), exported, then lowered the same way.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def quantized_export(spec: dict, scheme: str):
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_
    from transformers import AutoModelForCausalLM

    name, _, group = scheme.partition(":")
    if name != "8da4w":
        sys.exit(f"et_lower: unknown scheme {scheme!r} (8da4w:G)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    from kiln_export import llm

    folder, fname = os.path.split(llm.smollm2_gguf())
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32,
                                                 attn_implementation=llm.ATTN_IMPLEMENTATION).eval()
    max_seq = int(spec["constant_methods"]["get_max_seq_len"])
    module = llm.make_module(model, max_seq, False).eval()
    quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                            weight_granularity=PerGroup(int(group or 32))))
    # strict (dynamo) export, as ExecuTorch's LLM export does: the non-strict export of the quantized
    # wrapper (tensor-subclass weights, mutated cache buffers) fails in run_decompositions (torch 2.13)
    if spec.get("llm", {}).get("dynamic"):  # T from 1 to max_seq_len, as the spec's own .pt2
        t = torch.export.Dim("seq_len", min=1, max=max_seq)
        return torch.export.export(module, (torch.tensor([[1, 2]]), torch.tensor([0, 1])),
                                   dynamic_shapes=({1: t}, {0: t}), strict=True)
    return torch.export.export(module, (torch.tensor([[1]]), torch.tensor([0])), strict=True)


def main() -> None:
    spec_path, out = Path(sys.argv[1]), sys.argv[2]
    t0 = time.perf_counter()
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    stages = {"imports": time.perf_counter() - t0}
    spec = json.loads(spec_path.read_text())
    t = time.perf_counter()
    if len(sys.argv) > 3:
        ep = quantized_export(spec, sys.argv[3])
        stages["load, quantize, export"] = time.perf_counter() - t
    else:
        ep = torch.export.load(str(spec_path.parent / spec["exported_program"]))
        stages["load .pt2"] = time.perf_counter() - t
    t = time.perf_counter()
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()], constant_methods=spec["constant_methods"])
    stages["to_edge_transform_and_lower"] = time.perf_counter() - t
    t = time.perf_counter()
    prog = edge.to_executorch()
    with open(out + ".tmp", "wb") as f:
        f.write(prog.buffer)
    os.replace(out + ".tmp", out)
    stages["to_executorch, write"] = time.perf_counter() - t
    # one line for bench/llm_compare/lowering_time.py: seconds per stage
    print("et_lower stages " + json.dumps(stages), file=sys.stderr)


if __name__ == "__main__":
    main()
