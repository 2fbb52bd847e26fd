""".pte format: kiln's writer and verified loader against ExecuTorch 1.5 as the oracle.

(a) kiln's loader (`kiln inspect --json`) reads ExecuTorch's own GPT-2 programs
    (portable and XNNPACK) and agrees with ExecuTorch's deserializer.
(b) kiln's writer: a hand-built program (tests/pte/pte_writer_smoke.cpp) runs in
    ExecuTorch's runtime with torch's answer; ExecuTorch's deserializer reads
    back what was written, and ExecuTorch's serializer lays the segments out
    byte for byte as kiln did; ExecuTorch's GPT-2 programs rewritten by kiln's
    writer (tests/pte/pte_rewrite.cpp) run in ExecuTorch's runtime unchanged.
(c) kiln's schema compiles to the same binary layout as ExecuTorch's.
(d) damaged copies of real programs: `kiln inspect` fails with one line and
    exit status 1, never a crash.
"""
from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
from executorch.exir._serialize._program import (
    _get_extended_header,
    deserialize_pte_binary,
    serialize_pte_binary,
)
from executorch.exir.schema import DataLocation, Tensor as EtTensor
from executorch.runtime import Runtime

from conftest import REPO, et_lower, export_model, run_kiln

BACKENDS = ("portable", "xnnpack")
ET_SCHEMA_DIR = Path(sys.modules["executorch.exir._serialize._program"].__file__).parent

# ExecuTorch ScalarType names -> the dtype names kiln prints.
DTYPE_NAMES = {
    "BYTE": "uint8", "CHAR": "int8", "SHORT": "int16", "INT": "int32", "LONG": "int64",
    "HALF": "float16", "FLOAT": "float32", "DOUBLE": "float64", "BOOL": "bool",
    "BFLOAT16": "bfloat16", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
}


# ---------------------------------------------------------------------------
# fixtures


def _tool(kiln_bin: Path, name: str) -> Path:
    path = kiln_bin.parent / name
    if not path.is_file():
        raise RuntimeError(f"{name} not found next to {kiln_bin}; build the test tools first")
    return path


@pytest.fixture(scope="session")
def tools(kiln_bin) -> dict:
    return {n: _tool(kiln_bin, n) for n in ("kiln_pte_smoke", "kiln_pte_rewrite", "kiln_schema_dump")}


@pytest.fixture(scope="session")
def et_programs(tmp_path_factory) -> dict:
    """Tiny GPT-2 (seq_len 16) lowered by ExecuTorch itself: backend -> .pte path, plus the spec."""
    out = tmp_path_factory.mktemp("pte_format_gpt2")
    spec = export_model(out, "--config", "tiny", "--seq-len", "16")
    result = {"spec": spec}
    for backend in BACKENDS:
        result[backend] = et_lower(spec, backend)
        assert result[backend].is_file()
    return result


def _program_segments(data: bytes):
    """Program.segments as (offset, size), straight from the flatbuffer (ExecuTorch's reader)."""
    eh = _get_extended_header(data)
    size = eh.program_size if eh else len(data)
    return [(s.offset, s.size) for s in _flatbuffer_to_program(data[:size]).segments]


def _kind(evalue) -> str:
    return type(evalue.val).__name__


def _op_name(op) -> str:
    return f"{op.name}.{op.overload}" if op.overload else op.name


def _io(plan, index: int) -> dict:
    v = plan.values[index]
    io = {"index": index, "kind": _kind(v)}
    if isinstance(v.val, EtTensor):
        io["dtype"] = DTYPE_NAMES[v.val.scalar_type.name]
        io["shape"] = list(v.val.sizes)
    return io


def _run_et(path: Path, inputs):
    program = Runtime.get().load_program(str(path))
    method = program.load_method("forward")
    assert method is not None, f"ExecuTorch could not load forward() of {path}"
    return method.execute(inputs)


# ---------------------------------------------------------------------------
# (a) kiln's loader reads ExecuTorch's programs as ExecuTorch does


@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_agrees_with_executorch(et_programs, backend):
    path = et_programs[backend]
    data = path.read_bytes()
    info = json.loads(run_kiln("inspect", path, "--json").stdout)
    pte = deserialize_pte_binary(data)
    program = pte.program

    assert info["format"] == "pte"
    assert info["file_size"] == len(data)
    eh = _get_extended_header(data)
    assert info["program_size"] == eh.program_size
    assert info["segment_base_offset"] == eh.segment_base_offset

    assert [p["name"] for p in info["plans"]] == [p.name for p in program.execution_plan]
    for mine, plan in zip(info["plans"], program.execution_plan):
        instructions = [i.instr_args for c in plan.chains for i in c.instructions]
        assert mine["instructions"] == len(instructions)
        kernels = Counter(_op_name(plan.operators[a.op_index]) for a in instructions
                          if type(a).__name__ == "KernelCall")
        delegates = Counter(plan.delegates[a.delegate_index].id for a in instructions
                            if type(a).__name__ == "DelegateCall")
        assert mine["kernel_calls"] == dict(kernels)
        assert mine["delegate_calls"] == dict(delegates)
        assert mine["value_count"] == len(plan.values)
        assert mine["values"] == dict(Counter(_kind(v) for v in plan.values))
        assert mine["inputs"] == [_io(plan, i) for i in plan.inputs]
        assert mine["outputs"] == [_io(plan, i) for i in plan.outputs]
        assert mine["non_const_buffer_sizes"] == list(plan.non_const_buffer_sizes)

    # After deserialization ExecuTorch holds every constant (slot 0 included) in constant_buffer.
    assert info["constant_count"] == len(program.constant_buffer) - 1
    assert info["constant_bytes"] == sum(len(b.storage) for b in program.constant_buffer[1:])
    assert info["constant_count"] > 0

    assert [(s["offset"], s["size"]) for s in info["segments"]] == _program_segments(data)

    et_delegates = [(pi, di, d.id, len(program.backend_delegate_data[d.processed.index].data))
                    for pi, p in enumerate(program.execution_plan) for di, d in enumerate(p.delegates)]
    assert [(d["plan"], d["index"], d["backend"], d["size"]) for d in info["delegates"]] == et_delegates

    named = pte.named_data
    et_named = ([] if named is None else
                [(k, len(named.buffers[e.buffer_index])) for k, e in named.pte_data.items()])
    assert sorted((n["key"], n["size"]) for n in info["named_data"]) == sorted(et_named)

    if backend == "xnnpack":
        assert sum(info["plans"][0]["delegate_calls"].values()) > 0
        assert len(info["named_data"]) > 0
    else:
        assert info["plans"][0]["delegate_calls"] == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_reads_inline_constants_and_payloads(et_programs, tmp_path, backend):
    """The older layout, everything inside the flatbuffer (Program.constant_buffer, inline
    delegate data, no header, no segments), written by ExecuTorch's own flatbuffer serializer."""
    from executorch.exir._serialize._flatbuffer_program import _program_to_flatbuffer

    pte = deserialize_pte_binary(et_programs[backend].read_bytes())
    program = pte.program
    path = _write(tmp_path, f"inline_{backend}.pte", bytes(_program_to_flatbuffer(program).data))
    assert _get_extended_header(path.read_bytes()) is None
    info = json.loads(run_kiln("inspect", path, "--json").stdout)
    assert info["constants_inline"] is True
    assert info["segments"] == [] and info["named_data"] == []
    assert info["constant_count"] == len(program.constant_buffer) - 1 > 0
    assert info["constant_bytes"] == sum(len(b.storage) for b in program.constant_buffer[1:])
    et_delegates = [(d.id, "INLINE", d.processed.index, len(program.backend_delegate_data[d.processed.index].data))
                    for p in program.execution_plan for d in p.delegates]
    assert [(d["backend"], d["location"], d["location_index"], d["size"]) for d in info["delegates"]] == et_delegates
    assert len(et_delegates) == (0 if backend == "portable" else info["plans"][0]["delegate_calls"]["XnnpackBackend"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_inspect_text_summary(et_programs, backend):
    out = run_kiln("inspect", et_programs[backend]).stdout
    assert "ExecuTorch program (ET12)" in out
    assert "plan 'forward'" in out
    assert "int64[1, 16]" in out and "float32[1, 16, 1000]" in out
    assert re.search(r"planned memory: [\d,]+ bytes in 1 buffer", out)
    if backend == "xnnpack":
        assert re.search(r"^\s+\d+\s+XnnpackBackend$", out, re.M)


# ---------------------------------------------------------------------------
# (b) kiln's writer: ExecuTorch runs and reads back what kiln writes


W = (torch.arange(12, dtype=torch.float32) * 0.5 - 1.0).reshape(3, 4)
C = torch.tensor([1.0, -2.0, 3.0, 0.25])


def _smoke(tools, tmp_path, *flags) -> Path:
    out = tmp_path / ("smoke" + "".join(f.replace("--", "_") for f in flags) + ".pte")
    proc = subprocess.run([str(tools["kiln_pte_smoke"]), str(out), *flags], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not Path(str(out) + ".tmp").exists()
    return out


@pytest.mark.parametrize("flags", [(), ("--planned-input",)], ids=["runtime-input", "planned-input"])
def test_written_program_runs_in_executorch(tools, tmp_path, flags):
    path = _smoke(tools, tmp_path, *flags)
    torch.manual_seed(0)
    for _ in range(3):
        x = torch.randn(2, 3)
        (out,) = _run_et(path, [x])
        expected = x @ W + C
        assert out.shape == (2, 4) and out.dtype == torch.float32
        assert torch.allclose(out, expected, rtol=1e-6, atol=1e-6), (out, expected)


def test_written_program_structure_seen_by_executorch(tools, tmp_path):
    path = _smoke(tools, tmp_path)
    data = path.read_bytes()
    program = deserialize_pte_binary(data).program
    assert program.version == 0
    (plan,) = program.execution_plan
    assert plan.name == "forward"
    assert [(o.name, o.overload) for o in plan.operators] == [("aten::mm", "out"), ("aten::add", "out")]
    assert [(i.instr_args.op_index, list(i.instr_args.args)) for i in plan.chains[0].instructions] == [
        (0, [0, 1, 2, 2]), (1, [2, 3, 4, 5, 5])]
    assert [_kind(v) for v in plan.values] == ["Tensor"] * 4 + ["Int", "Tensor"]
    assert plan.values[4].val.int_val == 1
    x, w, out0, c, _, out1 = (v.val for v in plan.values)
    assert (x.sizes, w.sizes, out0.sizes, c.sizes, out1.sizes) == ([2, 3], [3, 4], [2, 4], [4], [2, 4])
    assert all(t.scalar_type.name == "FLOAT" for t in (x, w, out0, c, out1))
    assert (x.data_buffer_idx, x.allocation_info) == (0, None)
    assert (w.data_buffer_idx, c.data_buffer_idx) == (1, 2)
    assert (out0.allocation_info.memory_id, out0.allocation_info.memory_offset_low) == (1, 0)
    assert (out1.allocation_info.memory_id, out1.allocation_info.memory_offset_low) == (1, 32)
    assert list(out1.dim_order) == [0, 1]
    assert list(plan.inputs) == [0] and list(plan.outputs) == [5]
    assert list(plan.non_const_buffer_sizes) == [0, 64]
    assert program.constant_buffer[0].storage == b""
    assert bytes(program.constant_buffer[1].storage) == W.numpy().tobytes()
    assert bytes(program.constant_buffer[2].storage) == C.numpy().tobytes()

    eh = _get_extended_header(data)
    assert eh is not None and eh.length == 32
    assert eh.segment_base_offset % 128 == 0 and eh.segment_base_offset >= eh.program_size
    assert len(data) == eh.segment_base_offset + eh.segment_data_size
    assert _program_segments(data) == [(0, 64)]


def test_segments_laid_out_as_executorch_serializes_them(tools, tmp_path):
    """Delegate payloads (a segment one, an empty inline one) and named data: ExecuTorch reads
    them back, and re-serializing with ExecuTorch's defaults gives the same segments, byte for byte."""
    path = _smoke(tools, tmp_path, "--extras")
    data = path.read_bytes()
    pte = deserialize_pte_binary(data)
    (plan,) = pte.program.execution_plan
    assert [d.id for d in plan.delegates] == ["KilnTestBackend", "KilnEmptyBackend"]
    payloads = [bytes(pte.program.backend_delegate_data[d.processed.index].data) for d in plan.delegates]
    assert payloads == [bytes(k % 251 for k in range(1000)), b""]
    assert [(s.key, bytes(s.value)) for s in plan.delegates[0].compile_specs] == [("mode", b"\x01\x02")]
    constants = [bytes(b.storage) for b in pte.program.constant_buffer]
    assert constants[3] == bytes(3 * k for k in range(5)) + bytes(11)  # padded to the tensor alignment
    assert constants[4] == bytes(5 * k for k in range(8))              # the last one is not padded
    named = {k: bytes(pte.named_data.buffers[e.buffer_index]) for k, e in pte.named_data.pte_data.items()}
    assert named == {"alpha": bytes((7 * k) % 256 for k in range(300)), "beta": b"kiln!"}

    raw = _flatbuffer_to_program(data[:_get_extended_header(data).program_size])
    refs = [(d.processed.location, d.processed.index) for d in raw.execution_plan[0].delegates]
    assert refs == [(DataLocation.SEGMENT, 1), (DataLocation.INLINE, 0)]

    again = bytes(serialize_pte_binary(pte, extract_delegate_segments=True, segment_alignment=128))
    eh, eh_again = _get_extended_header(data), _get_extended_header(again)
    assert _program_segments(data) == _program_segments(again)
    assert eh.segment_data_size == eh_again.segment_data_size
    assert data[eh.segment_base_offset:] == again[eh_again.segment_base_offset:]
    assert len(data) == eh.segment_base_offset + eh.segment_data_size


def _drop_requires_grad(program):
    # kiln's ProgramModel does not carry requires_grad (runtime-irrelevant); compare without it.
    for plan in program.execution_plan:
        for v in plan.values:
            if isinstance(v.val, EtTensor):
                v.val.requires_grad = False
    return program


@pytest.mark.parametrize("backend", BACKENDS)
def test_rewritten_executorch_program_runs_unchanged(et_programs, tools, tmp_path, backend):
    """ExecuTorch's GPT-2 program, re-serialized by kiln's writer, is the same program to
    ExecuTorch's deserializer, has the same segments byte for byte, and gives the same logits."""
    src = et_programs[backend]
    dst = tmp_path / f"gpt2_{backend}_kiln.pte"
    proc = subprocess.run([str(tools["kiln_pte_rewrite"]), str(src), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    a, b = src.read_bytes(), dst.read_bytes()

    pa, pb = deserialize_pte_binary(a), deserialize_pte_binary(b)
    assert _drop_requires_grad(pa.program) == _drop_requires_grad(pb.program)
    na = None if pa.named_data is None else {k: bytes(pa.named_data.buffers[e.buffer_index])
                                             for k, e in pa.named_data.pte_data.items()}
    nb = None if pb.named_data is None else {k: bytes(pb.named_data.buffers[e.buffer_index])
                                             for k, e in pb.named_data.pte_data.items()}
    assert na == nb

    ea, eb = _get_extended_header(a), _get_extended_header(b)
    assert _program_segments(a) == _program_segments(b)
    assert ea.segment_data_size == eb.segment_data_size
    assert a[ea.segment_base_offset:] == b[eb.segment_base_offset:]

    spec_dir = et_programs["spec"].parent
    ids = torch.from_numpy(np.load(spec_dir / "gpt2_input0.npy"))
    expected = torch.from_numpy(np.load(spec_dir / "gpt2_expected_output0.npy"))
    (out_et,) = _run_et(src, [ids])
    (out_kiln,) = _run_et(dst, [ids])
    assert torch.equal(out_et, out_kiln)
    tol = 1e-4 * expected.abs().max().item()
    assert (out_kiln - expected).abs().max().item() <= tol


# ---------------------------------------------------------------------------
# (c) the schema


def _compile_schema(fbs: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["flatc", "-b", "--schema", "-o", str(out), str(fbs)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out / (fbs.stem + ".bfbs")


def _force_aligns(fbs_text: str) -> dict:
    """(table, field) -> force_align, which flatc's compiled schema does not record for vectors."""
    out = {}
    for table, body in re.findall(r"table\s+(\w+)\s*\{(.*?)\}", fbs_text, re.S):
        for field, align in re.findall(r"(\w+)\s*:[^;]*?force_align\s*:\s*(\d+)", body):
            out[(table, field)] = int(align)
    return out


def test_schema_is_binary_compatible_with_executorch(tools, tmp_path):
    kiln_fbs = REPO / "schema" / "kiln_program.fbs"
    et_fbs = ET_SCHEMA_DIR / "program.fbs"
    assert et_fbs.is_file(), et_fbs
    dumps = []
    for name, fbs in (("kiln", kiln_fbs), ("executorch", et_fbs)):
        bfbs = _compile_schema(fbs, tmp_path / name)
        proc = subprocess.run([str(tools["kiln_schema_dump"]), str(bfbs)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        dumps.append(proc.stdout)
    assert "file_identifier ET12" in dumps[0] and "table Program" in dumps[0]
    assert dumps[0] == dumps[1]
    assert _force_aligns(kiln_fbs.read_text()) == _force_aligns(et_fbs.read_text()) != {}


# ---------------------------------------------------------------------------
# (d) damaged files: one clean line, exit status 1, never a crash


def _assert_clean_failure(proc, *needles):
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # negative: killed by a signal
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kiln: error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    assert proc.stdout == ""


def _inspect(path: Path):
    return run_kiln("inspect", path, "--json", check=False)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_wrong_file_identifier(et_programs, tmp_path):
    data = bytearray(et_programs["portable"].read_bytes())
    data[4:8] = b"ET11"
    _assert_clean_failure(_inspect(_write(tmp_path, "ident.pte", bytes(data))), "file identifier is 'ET11'")


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_files(et_programs, tmp_path, backend):
    data = et_programs[backend].read_bytes()
    eh = _get_extended_header(data)
    cuts = [0, 4, 7, 8, 20, 39, 40, 100, eh.program_size // 2, eh.program_size - 1, eh.program_size,
            eh.segment_base_offset + 10, len(data) - 1]
    for cut in cuts:
        path = _write(tmp_path, f"cut{cut}.pte", data[:cut])
        _assert_clean_failure(_inspect(path), str(path))


def test_segment_offset_past_the_end(et_programs, tmp_path):
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program as FbProgram

    data = bytearray(et_programs["xnnpack"].read_bytes())
    root = FbProgram.GetRootAs(bytes(data), 0)
    index = next(i for i in range(root.SegmentsLength()) if root.Segments(i).Offset() > 0)
    seg = root.Segments(index)
    field = seg._tab.Offset(4)  # DataSegment.offset (first field)
    assert field != 0
    pos = seg._tab.Pos + field
    assert int.from_bytes(data[pos:pos + 8], "little") == seg.Offset()
    data[pos:pos + 8] = (len(data) * 2).to_bytes(8, "little")
    _assert_clean_failure(_inspect(_write(tmp_path, "segment.pte", bytes(data))),
                          f"segment {index} starts past the end of the {len(data)}-byte file")


def test_segment_size_past_the_end(et_programs, tmp_path):
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program as FbProgram

    data = bytearray(et_programs["portable"].read_bytes())
    seg = FbProgram.GetRootAs(bytes(data), 0).Segments(0)
    pos = seg._tab.Pos + seg._tab.Offset(6)  # DataSegment.size
    data[pos:pos + 8] = (seg.Size() + 1).to_bytes(8, "little")
    _assert_clean_failure(_inspect(_write(tmp_path, "segsize.pte", bytes(data))), "segment 0", "ends past")


def test_extended_header_damage(et_programs, tmp_path):
    data = et_programs["portable"].read_bytes()
    cases = {
        "magic": (8, b"eh01", "no extended header"),
        "length": (12, (8).to_bytes(4, "little"), "extended header length 8"),
        "program_size": (16, (len(data) + 1).to_bytes(8, "little"), "program size"),
        "segment_base": (24, (1 << 40).to_bytes(8, "little"), "segment base offset"),
        "segment_data_size": (32, (len(data)).to_bytes(8, "little"), "segment data"),
    }
    for name, (at, patch, needle) in cases.items():
        bad = bytearray(data)
        bad[at:at + len(patch)] = patch
        _assert_clean_failure(_inspect(_write(tmp_path, f"eh_{name}.pte", bytes(bad))), needle)


def test_root_offset_out_of_bounds(et_programs, tmp_path):
    data = bytearray(et_programs["portable"].read_bytes())
    data[0:4] = (0x7FFFFFF0).to_bytes(4, "little")
    _assert_clean_failure(_inspect(_write(tmp_path, "root.pte", bytes(data))), "fails verification")


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_bit_flips_never_crash(et_programs, tmp_path, backend):
    """Bit flips anywhere in the header and flatbuffer: each copy either loads or fails cleanly."""
    data = et_programs[backend].read_bytes()
    program_size = _get_extended_header(data).program_size
    rng = random.Random(1234)
    positions = list(range(0, 48)) + [rng.randrange(48, program_size) for _ in range(250)]
    failures = 0
    for n, pos in enumerate(positions):
        bad = bytearray(data)
        bad[pos] ^= 1 << rng.randrange(8)
        proc = _inspect(_write(tmp_path, f"flip{n}.pte", bytes(bad)))
        assert proc.returncode in (0, 1), (pos, proc.returncode, proc.stderr)
        if proc.returncode == 1:
            _assert_clean_failure(proc)
            failures += 1
        else:
            json.loads(proc.stdout)
    assert failures > 0
