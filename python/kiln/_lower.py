"""kiln.lower: kiln::lower (src/compiler/lower.cpp, what `kiln lower` runs) from Python."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from . import _kiln
from ._kiln import Error

PathLike = Union[str, "os.PathLike[str]"]

# What the metadata JSON and the debug map name as "exported_program" for a program kiln.lower was handed as a
# torch.export.ExportedProgram object (for a .pt2 or a spec: the .pt2's path, as `kiln lower` writes it).
EXPORTED_PROGRAM_SOURCE = "<torch.export.ExportedProgram in memory>"


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    """Every failure as kiln.Error: a library exception kiln did not turn into its own reads as the
    CLI's `kiln: error: internal: ...` line does."""
    try:
        yield
    except Error:
        raise
    except MemoryError:
        raise Error("out of memory") from None
    except (RuntimeError, ValueError, OSError) as e:
        raise Error("internal: " + " ".join(str(e).split())) from None


def _is_exported_program(obj: Any) -> bool:
    # torch is imported only when the caller already has: an ExportedProgram cannot exist without it
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.export.ExportedProgram)


class LoweredProgram:
    """The result of kiln.lower: the ExecuTorch program and what kiln reports about it.

    Attributes:
        pte: the program's bytes (an ExecuTorch .pte; kiln.load or ExecuTorch's runtime run it).
        metadata: the metadata JSON `kiln lower` writes beside a .pte, as a dict (model, model_id,
            backend, exported_program, pte, pte_size_mb, seq_len, delegation, and kiln's own keys).
        delegation: the delegation summary (None for backend="portable"): delegate_call_sites,
            delegated_node_count, fallback_ops {target: count}, fallback_count, fallback_reasons
            {target: [kiln's reasons]}, xnnpack_nodes, quantization, ...
        warnings: one line each (e.g. a quantize_skip regex that matched nothing).
    """

    def __init__(self, result: "_kiln._Lowered", workdir: str):
        self._result = result
        self._pte: Optional[bytes] = None
        self.metadata: dict = json.loads(result.metadata_json)
        self.delegation: Optional[dict] = self.metadata.get("delegation")
        self.warnings: list = list(result.warnings)
        # the lowering's own files live in a private directory as long as this object
        self._cleanup = weakref.finalize(self, shutil.rmtree, workdir, True)

    @property
    def pte(self) -> bytes:
        """The .pte's bytes."""
        if self._pte is None:
            self._pte = Path(self._result.pte_path).read_bytes()
        return self._pte

    def write(self, path: PathLike) -> dict:
        """Writes the program to `path` (which must end in .pte) as `kiln lower --out path` does: the .pte,
        its metadata JSON (path with .json) and its debug map (.debug.json), staged beside it and renamed
        into place together (no partial file on failure). Returns the metadata written."""
        with _one_line():
            written = self._result.write(os.fspath(path))
        return json.loads(written.metadata_json)

    def __repr__(self) -> str:
        m = self.metadata
        return (f"<kiln.LoweredProgram {m.get('model')} ({m.get('backend')}), "
                f"{m.get('pte_size_bytes', 0) / 1e6:.2f} MB>")


def lower(program: Any, backend: str = "portable", quantize: Optional[str] = None, *, per_op: bool = False,
          quantize_scales: Optional[str] = None, quantize_embedding: Optional[str] = None,
          quantize_skip: Optional[str] = None, name: Optional[str] = None, model_id: str = "", seq_len: int = 0,
          constant_methods: Optional[dict] = None, verify: bool = True, debug_map: bool = True) -> LoweredProgram:
    """Lowers an exported PyTorch program to an ExecuTorch program (.pte) with kiln.

    The lowering is `kiln lower`'s (the same C++ code: the same .pte bytes for the same program and options),
    in place of ExecuTorch's to_edge_transform_and_lower(...).to_executorch():

        ep = torch.export.export(model, example_inputs)
        lowered = kiln.lower(ep, backend="xnnpack")            # or quantize="8da4w"
        lowered.write("model.pte")                              # + model.json, model.debug.json
        print(lowered.delegation["fallback_ops"])               # what did not go to XNNPACK, and why:
        print(lowered.delegation["fallback_reasons"])
        outputs = kiln.load(lowered).forward(*example_inputs)   # or ExecuTorch's runtime on model.pte

    Args:
        program: a torch.export.ExportedProgram (serialized in memory with torch.export.save; no file of
            yours is involved), the path of a .pt2 file (torch.export.save's archive), or the path of a
            model_spec.json (the export front end's spec, as `kiln lower --spec` takes).
        backend: "portable" (ExecuTorch's portable kernels only) or "xnnpack" (XNNPACK delegate regions).
        quantize: xnnpack only: "8da4w[:32|64|128|256]" (int8 dynamic activations x int4 weights per group),
            "8da8w" or "int8w"; linear layers. None: fp32.
        per_op: xnnpack only: one delegate call per supported node instead of maximal regions.
        quantize_scales: with quantize: "mse" (default) or "minmax" (torchao's rule).
        quantize_embedding: "4[:G]" or "8[:G]": embedding tables as ExecuTorch's quantized lookups.
        quantize_skip: with quantize: a regex; linear layers whose module path, node or weight name it
            matches stay fp32.
        name, model_id, seq_len: the metadata's model fields for an ExportedProgram or a .pt2 (a spec
            carries its own); name defaults to the .pt2's stem, or "model".
        constant_methods: {name: value or [values]}: methods of the program that return constants, as a
            spec's "constant_methods" (ExecuTorch's LLM runner, kiln.generate read get_max_seq_len,
            get_eos_ids, get_bos_id, use_kv_cache, ...); added to (or replacing) a spec's own.
        verify: load the written program back with kiln's runtime before it is published.
        debug_map: write the debug map (X.debug.json) beside the .pte.

    Returns:
        A LoweredProgram: .pte (bytes), .write(path) (the .pte, its metadata JSON and debug map, written
        as one set), .delegation (None for portable), .metadata, .warnings. The metadata's
        "exported_program" is the .pt2's path (a spec's: the one it names), or, for an ExportedProgram,
        "<torch.export.ExportedProgram in memory>".

    Raises:
        kiln.Error: with the one-line message `kiln lower` prints after "kiln: error:".
    """
    if backend not in ("portable", "xnnpack"):
        raise Error(f"backend '{backend}': kiln lowers portable or xnnpack")
    workdir = tempfile.mkdtemp(prefix="kiln-lower-")
    try:
        spec_path = pt2_path = source = ""
        if _is_exported_program(program):
            import torch  # the caller's: the program is a torch object

            buf = io.BytesIO()
            with _one_line():
                torch.export.save(program, buf)
            name = name or "model"
            pt2_path = os.path.join(workdir, f"{name}.pt2")
            with open(pt2_path, "wb") as f:
                f.write(buf.getbuffer())
            del buf
            # the metadata's "exported_program" (a path for a .pt2 or a spec): what the program is, not the
            # private file it was serialized to for the lowering
            source = EXPORTED_PROGRAM_SOURCE
        elif isinstance(program, (str, os.PathLike)):
            path = os.fspath(program)
            if path.endswith(".json"):
                spec_path = path
            else:
                pt2_path = path
        else:
            raise Error(f"kiln.lower takes a torch.export.ExportedProgram, a .pt2 path or a model_spec.json path, "
                        f"not {type(program).__name__}")
        out = os.path.join(workdir, "program.pte")
        with _one_line():
            result = _kiln.lower(spec_path, pt2_path, name or "", model_id, int(seq_len), out, backend, per_op,
                                 quantize or "", quantize_scales or "", quantize_embedding or "", quantize_skip or "",
                                 verify, debug_map, dict(constant_methods or {}), source)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    if pt2_path and spec_path == "" and pt2_path.startswith(workdir):
        os.unlink(pt2_path)  # read: the .pte holds everything now
    return LoweredProgram(result, workdir)
