"""The ONNX peer's model: the exported program kiln lowers, converted with torch.onnx.

python bench/ort_export.py --spec DIR/model_spec.json [--out FILE.onnx] [--opset N]

Reads DIR/<name>.pt2 (the torch.export archive that `python -m kiln_export` wrote and
`kiln lower` reads, so the weights, seed and config are the same by construction),
converts it with torch.onnx's dynamo exporter (torch.onnx.export(..., dynamo=True), which
works offline with onnx + onnxscript; the legacy TorchScript exporter fails on GPT-2 here:
transformers' mask code uses aten::diff, which it cannot translate) and writes
DIR/<name>.onnx (one file, weights inside) plus DIR/<name>.onnx.json (versions, opset).
The file is written under a temporary name and renamed, so a failure leaves nothing.

Nothing here checks the numbers: bench/ort_bench.py runs the file against the spec's
eager reference output before it times anything.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path


def default_out(spec_path: Path) -> Path:
    spec = json.loads(spec_path.read_text())
    return spec_path.parent / f"{spec['name']}.onnx"


def export_onnx(spec_path: str | os.PathLike, out: str | os.PathLike | None = None,
                opset: int | None = None, quiet: bool = False) -> Path:
    """Converts the spec's .pt2 to ONNX; returns the path written."""
    import torch

    spec_path = Path(spec_path)
    spec = json.loads(spec_path.read_text())
    pt2 = spec_path.parent / spec["exported_program"]
    out = Path(out) if out else default_out(spec_path)
    ep = torch.export.load(str(pt2))
    names_in = [i["name"] for i in spec["inputs"]]
    names_out = [o["name"] for o in spec["outputs"]]
    kw = {"opset_version": opset} if opset else {}
    t0 = time.perf_counter()
    # The exporter logs its steps on stdout; the caller's stdout stays ours.
    buf = io.StringIO()
    with torch.no_grad(), contextlib.redirect_stdout(buf):
        prog = torch.onnx.export(ep, (), dynamo=True, input_names=names_in, output_names=names_out,
                                 verbose=False, **kw)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        prog.save(str(tmp), external_data=False)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    dt = time.perf_counter() - t0

    import onnx
    import onnxscript
    model = onnx.load(str(out), load_external_data=False)
    meta = {
        "source": pt2.name, "exporter": "torch.onnx.export(dynamo=True)",
        "torch_version": torch.__version__, "onnx_version": onnx.__version__,
        "onnxscript_version": onnxscript.__version__,
        "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "nodes": len(model.graph.node), "export_s": round(dt, 1),
    }
    meta_path = out.with_name(out.name + ".json")
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    if not quiet:
        print(f"ort_export: wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {meta['nodes']} nodes, "
              f"opset {meta['opset'].get('ai.onnx')}) in {dt:.1f} s", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/ort_export.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="model_spec.json written by python -m kiln_export")
    ap.add_argument("--out", help="output .onnx (default: <spec dir>/<name>.onnx)")
    ap.add_argument("--opset", type=int, help="ONNX opset (default: the exporter's)")
    args = ap.parse_args(argv)
    try:
        export_onnx(args.spec, args.out, args.opset)
    except (OSError, ValueError, KeyError) as e:
        print(f"ort_export: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
