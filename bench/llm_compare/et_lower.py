"""ExecuTorch's own .pte of an LLM .pt2 from `python -m kiln_export llm`: to_edge_transform_and_lower
with XnnpackPartitioner, the constant methods its LLM runner reads (from model_spec.json), written
to OUT.tmp then renamed.

    .venv/bin/python bench/llm_compare/et_lower.py MODEL_SPEC.json OUT.pte
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    spec_path, out = Path(sys.argv[1]), sys.argv[2]
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    spec = json.loads(spec_path.read_text())
    ep = torch.export.load(str(spec_path.parent / spec["exported_program"]))
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                       constant_methods=spec["constant_methods"]).to_executorch()
    with open(out + ".tmp", "wb") as f:
        f.write(prog.buffer)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
