"""Rewrites a GGUF file with every tensor dequantized to F32 (the same weights, the same metadata,
general.file_type ALL_F32), with the `gguf` package: the fp32 llama.cpp side of bench/llm_compare.

    .venv/bin/python bench/llm_compare/gguf_f32.py IN.gguf OUT.gguf

Written to OUT.gguf.tmp, then renamed.
"""
from __future__ import annotations

import os
import sys

import numpy as np


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    import gguf
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    tmp = dst + ".tmp"
    w = GGUFWriter(tmp, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        val = f.contents()
        if f.name == "general.file_type":
            val = int(gguf.LlamaFileType.ALL_F32)
        vtype = f.types[0]
        sub = f.types[1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(f.name, val, vtype, sub_type=sub)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml's ne order is reversed numpy order
        w.add_tensor(t.name, np.ascontiguousarray(data.reshape(shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()
