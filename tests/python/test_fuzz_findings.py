"""Regression tests for what the fuzzers (fuzz/*.cpp, scripts/fuzz, docs/FUZZING.md) found: each input
goes through the kiln command that reads that kind of file, in the release build and in the sanitizer
build (build-asan/kiln: ASan + UBSan + LeakSanitizer report what a plain run would not), and must end
with exit status 1, exactly one stderr line "kiln: error: ..." naming the reason, and no file written."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from conftest import REPO
from test_hostile_files import patch_sizes
from test_hostile_tokenizer import _byte_level_tokenizer, assert_refused, kiln, run  # noqa: F401 (kiln: fixture)


def listing(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return _byte_level_tokenizer(tmp_path_factory.mktemp("fuzz_tok") / "tokenizer.json")


# fuzz_chat_template: "{%-%}" (a block tag whose only content is one whitespace-control dash) took the
# dash as both the left and the right one and popped a character off an empty string (UBSan; the
# release build then read a corrupt string length and reported "out of memory").
@pytest.mark.parametrize("source", ["{%-%}", "{{-}}", "x {#-#} y {%-%}"])
def test_tag_of_one_dash(kiln, tokenizer, tmp_path, source):
    template = tmp_path / "t.jinja"
    template.write_text(source)
    before = listing(tmp_path)
    proc = run(kiln, "tokenize", "--tokenizer", tokenizer, "--chat", "--text", "hi", "--chat-template", template)
    assert_refused(proc, "chat template")
    assert "out of memory" not in proc.stderr
    assert listing(tmp_path) == before


def test_tag_of_one_dash_in_a_comment_renders(kiln, tokenizer, tmp_path):
    """A comment of one dash is a comment (jinja2 renders it as nothing): kiln too, not a refusal."""
    import jinja2

    source = "a {#-#} b{{ messages[0]['content'] }}"
    template = tmp_path / "t.jinja"
    template.write_text(source)
    proc = run(kiln, "tokenize", "--tokenizer", tokenizer, "--chat", "--text", "hi", "--chat-template", template,
               "--print-prompt")
    assert proc.returncode == 0, proc.stderr
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    assert proc.stdout.rstrip("\n") == env.from_string(source).render(messages=[{"role": "user", "content": "hi"}])


# fuzz_pt2: an archive refused after it opened (a stored entry declaring more bytes than it holds)
# leaked libzip's handle: LeakSanitizer in the sanitizer build.
def test_refused_archive_leaks_nothing(kiln, tmp_path):
    pt2 = tmp_path / "liar.pt2"
    with zipfile.ZipFile(pt2, "w") as z:
        z.writestr("m/archive_format", "pt2")
        z.writestr("m/archive_version", "1")
    patch_sizes(pt2, "m/archive_version", 65281)  # the fuzzer's input: 0xff01 declared, 1 held
    before = listing(tmp_path)
    proc = run(kiln, "inspect", pt2)
    assert_refused(proc, "archive entry 'm/archive_version' is stored uncompressed but declares 65281 bytes and holds 1")
    assert listing(tmp_path) == before


# fuzz_model_spec: an input or output entry whose "name" or "dtype" is not a string threw nlohmann's
# type_error out of the spec reader (one line from the CLI, but "a JSON input is not of the form kiln
# reads", naming neither the file nor the field; an uncaught exception for a library caller); a dim of
# 2^64 - 1 read as -1.
@pytest.mark.parametrize("entry,needle", [
    ({"name": 5}, "'inputs' field 'name' of an entry must be a string"),
    ({"name": "x", "dtype": ["float32"]}, "'inputs' field 'dtype' of an entry must be a string"),
    ({"name": "x", "shape": [1, 18446744073709551615]}, "'inputs' shape of 'x' has a dim that is not a non-negative integer"),
    ({"name": "x", "shape": [-4]}, "'inputs' shape of 'x' has a dim that is not a non-negative integer"),
])
@pytest.mark.parametrize("command", ["inspect", "lower"])
def test_spec_entry_of_the_wrong_type(kiln, tmp_path, entry, needle, command):
    spec = tmp_path / "model_spec.json"
    spec.write_text(json.dumps({"name": "m", "exported_program": "m.pt2", "inputs": [entry]}))
    before = listing(tmp_path)
    proc = run(kiln, "inspect", spec) if command == "inspect" else run(kiln, "lower", "--spec", spec)
    assert_refused(proc, f"{spec}: {needle}")
    assert listing(tmp_path) == before


# fuzz_pt2_graph: a models/<name>.json that is JSON but not an object ("0", "[]") threw nlohmann's
# type_error out of read_pt2 (the CLI's line named neither the archive nor the entry).
@pytest.mark.parametrize("graph", ["0", "[]", '"text"'])
def test_graph_json_that_is_not_an_object(kiln, tmp_path, graph):
    pt2 = tmp_path / "g.pt2"
    with zipfile.ZipFile(pt2, "w") as z:
        z.writestr("m/archive_format", "pt2")
        z.writestr("m/byteorder", "little")
        z.writestr("m/models/model.json", graph)
    before = listing(tmp_path)
    proc = run(kiln, "inspect", pt2)
    assert_refused(proc, f"{pt2}: m/models/model.json")
    assert "expected a JSON object" in proc.stderr
    assert listing(tmp_path) == before


# fuzz_pte: a convolution whose padding the mutation made 9079256848778919937: the output size
# 2 * padding overflowed int64 in the portable conv kernel (UBSan: signed integer overflow,
# src/kernels/portable/conv.cpp); the release build computed a garbage size. The input is the
# fuzzer's file (2,540 bytes: a kiln-lowered Conv2d + max_pool2d seed with bytes changed), stored
# zlib-compressed. The kernel now checks its output-size arithmetic and refuses.
CONV_PADDING_OVERFLOW_PTE = (
    "eNqtVV1sU1UcP+1KW+bcl2VO3WbTTMNDM9plwtb03izxA5TFMFMNSRndXK9bzbVtulupOnjDzD2p8MCDMRIJIYaHOWFg2L2ZUQPhaRIeFh1xJI"
    "SYQBSTIrp1vf7POf/LPS3zgcST/HrO/X/8/h/no1FCyIuxcLcyHgr5Yb3oJXxs5tNtYo9G0gq/LuIldbD2AQhJAvYBYoAQ08J32TTpXEMeHCvC"
    "2gGoA3gZE+WtjCfatbFVC9kqxG8FqZ90gpSQkoeQU25CCmCsAoYBx0Deib40H6dI6qxc9qPNiX9Mk+axFdAOGNGUdCTyzkghkc1k1O5k4kBKG0"
    "+k0snUqDKBNWbyGllGPxqr6b7faCb9bkbNa6lMWrB1sF7SUQszr6cWe2FBzG0X5vb3qmnSdtD1AKwdKN+MMX2ALYDHAU8AngQ8hTnRWnrXuD/v"
    "ufd+zynHI0KvacxNzIbLqX0D5tyEoHYdONPxNOAHIFIBIYAXcAMKngEcBRQAA4AQwAf4DYIsAuYBpwAFwD6AD1AE0iXAacDHgEnAXkAU0ApwAc"
    "5DPFXoja9kmmsm2UTXc7xOtx97QmWTa7xfCw7cepytMxgrMZ9aavtXiZ9fp9A/jesZfwtfe0T+ZeTvd/Bv4nDWuJAfylWsvZwXePaXHsyzs2Tn"
    "uQEP46BwrTNfplPhvvn4t4fVv87zpz6tuD89XO+k8pPrPAa1GBD8fhf8WtBPFfyuQpxJwb4D7zkdRwV5d9nuXzPqH8N5XuDrAjvrGl4V5M8Kcj"
    "rurNs9+5Sv3W14Hlk9ZfsuVPfLhegpC/WXrfrhTJaF+oW8H0V9vZBHQeBYMU1zSvi+A9/H+HcNv1MuFve0wP+qafPj88ruPcHeWlwvmXZ+twX5"
    "fkHuMm3ekwKvG/UenIOm7f+57X/oBUE+J/B6kZe/QW54A1yM0+K33nRr33uRx7KvQ3uLb2+VvrFKT8eiae/vJb52+/D9cQq21p7S99KDLxj187"
    "Gz4GM1e9ltbsT31eapPh81Qj2cs76Ck9+b5gpWyovnueLOLmH/FjY4g07hDHpZd3gMBjAowxwPB/0fBLT3skog4g+8mU+pWio90aXls6oSCPoD"
    "8C+iKQWNKtN5VWWi8ZSazCnpxERWGQVF/H/zpxYVPpag2mPo4NDBDfOGv0atKmx8KPBfFEOE9FX34GFywLP+ViZ3YCSXJA87+mYT0uULW+TUwp"
    "gsmX3GTzdn9Ok5XYqv7pT3eF+Tyb2YfDnQL527Pmhs/+Lr6LVyi3H4j2GjPfeG3HB4hxz+Pmvc/KZH2vZlQD/ya4d+5t6yfu34t9L2u/XG0t0Z"
    "abC9KEUuBWXl0Blp9nraOPFJm/Gy508p3PSKdHFn1JhdrTWK9aPy4vGAvO39K/rrpZzedEsxzl2ZvlD87jnjo2DE+PlibP6zYqPUMPOjfmRHgz"
    "y80mx8SOLy82PPyHNTu43wrqw+3d8VPftLneRdTUpfpXXJqu/84Fi0d+qWbrx9Q/oX/8r9ZQ=="
)


def test_conv_padding_that_overflows_the_output_size(kiln, tmp_path):
    import base64
    import zlib

    import numpy as np

    pte = tmp_path / "conv.pte"
    pte.write_bytes(zlib.decompress(base64.b64decode(CONV_PADDING_OVERFLOW_PTE)))
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 2, 4, 4), dtype=np.float32))  # the program's one input, float32[1, 2, 4, 4]
    before = listing(tmp_path)
    proc = run(kiln, "run", pte, "--input", x, "--output", tmp_path / "y.npy")
    assert_refused(proc, "output size overflows")
    assert listing(tmp_path) == before


# fuzz_pte (2026-12-05): a kiln-lowered Conv2d + max_pool2d seed whose pooling arguments the mutation made
# huge (stride and padding near 2^62): the output size's floor division of a negative span by the stride
# computed -span + stride - 1, which overflowed int64 (UBSan, src/kernels/portable/pool.cpp). The mutation
# also emptied the method's name, so it is run with --method "". An empty output is refused.
def test_pool_negative_span_with_a_huge_stride(kiln, tmp_path):
    import numpy as np

    pte = REPO / "fuzz" / "regressions" / "pte" / "pool_negative_span_overflow.pte"
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 2, 4, 4), dtype=np.float32))  # the program's one input, float32[1, 2, 4, 4]
    before = listing(tmp_path)
    proc = run(kiln, "run", pte, "--method", "", "--input", x, "--output", tmp_path / "y.npy")
    assert_refused(proc, "the output would be empty")
    assert listing(tmp_path) == before


# fuzz_pte (2026-12-05): the same seed with max_pool2d's kernel width made 70368744177666 (and ceil_mode): a
# valid pooling whose window covers the 4-wide input once, but the portable kernel stepped through all 2^46
# taps of it, skipping the ones outside the input (a timeout). It now visits only the taps inside the input.
# The fuzzer's file (fuzz/regressions/pte/max_pool_huge_kernel_timeout.pte) is replayed by the CI smoke; here
# a pooling of the same shape exported from torch (whose eager takes int32 sizes: a kernel 2^31 - 1 wide, which
# the old loop also stepped through, tap by tap), against eager in kiln's runtime.
def test_max_pool_with_a_huge_kernel_visits_only_the_input(tmp_path):
    import torch

    from test_functionalize import compare, export_mutating, io_of
    from test_xnnpack_runtime import kiln_run
    from conftest import kiln_lower

    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x, kernel_size=(2, 2**31 - 1), ceil_mode=True)

    torch.manual_seed(0)
    spec = export_mutating(Pool(), (torch.randn(1, 3, 4, 4),), tmp_path / "pool", "pool")
    ins, refs = io_of(spec)
    pte = kiln_lower(spec, "portable")
    compare(kiln_run(pte, ins, tmp_path), refs, "max_pool2d with a 2^31-wide kernel in kiln's runtime")


# The whole pytest suite under the sanitizer build (2026-12-05, docs/FUZZING.md): every XNNPACK program ended
# with a UBSan report, "member call on address ... which does not point to an object of type
# '_Sp_counted_base' ... invalid vptr", exit 87, from `kiln run` (any --threads) and `kiln generate`: the
# runtime is built -fno-rtti, and the linker kept a vptr-checked copy of libstdc++'s ~__shared_count from an RTTI
# object, which then met the -fno-rtti vtable of the XNNPACK state's shared_ptr<ThreadPool> (a valid object).
# The sanitizer build now leaves out the vptr check (CMakeLists.txt). An XNNPACK program (a delegated linear
# and relu), one and two threads, in both builds: exit 0, nothing on stderr from a sanitizer, eager's output.
@pytest.mark.parametrize("threads", [1, 2])
def test_xnnpack_program_ends_clean_under_the_sanitizers(kiln, tmp_path, threads):
    import numpy as np
    import torch

    from test_functionalize import compare, export_mutating, io_of
    from conftest import kiln_lower

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    spec = export_mutating(model, (torch.randn(4, 16),), tmp_path / "mlp", "mlp")
    ins, refs = io_of(spec)
    pte = kiln_lower(spec, "xnnpack")
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, ins[0])
    proc = run(kiln, "run", pte, "--input", x, "--output", y, "--threads", str(threads))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert "runtime error" not in proc.stderr and "Sanitizer" not in proc.stderr, proc.stderr[-3000:]
    compare([np.load(y)], refs, f"an XNNPACK linear-relu-linear on {threads} thread(s)")


# The same whole-suite run: test_coverage_subset's fill sample on a float32[1, 0, 3] input lowers to a constant
# of no elements, whose fingerprint (src/emit/emitter.cpp) memcpy'd 0 bytes into an empty vector's null data
# pointer (UBSan: "null pointer passed as argument 1, which is declared to never be null", exit 87; the release
# build did nothing wrong in practice). The emitter now reads nothing for an empty constant. Both builds, both
# backends: `kiln lower` exits 0 with no sanitizer report, and `kiln run` gives an output of eager's shape and dtype.
@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_constant_of_no_elements_lowers_clean(kiln, tmp_path, backend):
    import numpy as np
    import torch

    from test_functionalize import export_mutating, io_of

    class Fill(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.fill.Scalar(x, True)

    spec = export_mutating(Fill(), (torch.randn(1, 0, 3),), tmp_path / "fill", "fill")
    ins, refs = io_of(spec)
    pte, x, y = tmp_path / f"fill_{backend}.pte", tmp_path / "x.npy", tmp_path / "y.npy"
    proc = run(kiln, "lower", "--spec", spec, "--backend", backend, "--out", pte, "-q")
    assert proc.returncode == 0 and "runtime error" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    np.save(x, ins[0])
    proc = run(kiln, "run", pte, "--input", x, "--output", y)
    assert proc.returncode == 0 and "runtime error" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    got = np.load(y)
    assert (got.shape, got.dtype) == (refs[0].shape, refs[0].dtype) == ((1, 0, 3), np.float32), (got, refs[0])


# The same run: lowering tiny Llama (aten.diff with prepend, from its mask) read freed memory in
# src/passes/decompose.cpp (ASan: heap-use-after-free): diff's lowering kept a reference to its input's metadata
# across emits that add values to the graph and may move them. It now keeps a copy. A chain of diffs with
# prepend / append (one of them crosses the graph's growth), both builds: exit 0, no report, eager's output.
def test_diff_chain_lowers_without_reading_freed_metadata(kiln, tmp_path):
    import numpy as np
    import torch

    from test_functionalize import compare, export_mutating, io_of

    class Diffs(torch.nn.Module):
        def forward(self, x, p):
            for i in range(12):
                x = torch.diff(x, dim=-1, prepend=p) if i % 2 else torch.diff(x, dim=-1, append=p)
            return x

    torch.manual_seed(0)
    spec = export_mutating(Diffs(), (torch.randn(2, 8), torch.randn(2, 1)), tmp_path / "diffs", "diffs")
    ins, refs = io_of(spec)
    pte, y = tmp_path / "diffs.pte", tmp_path / "y.npy"
    proc = run(kiln, "lower", "--spec", spec, "--backend", "portable", "--out", pte, "-q")
    assert proc.returncode == 0 and "Sanitizer" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    args = []
    for i, a in enumerate(ins):
        np.save(tmp_path / f"x{i}.npy", a)
        args += ["--input", tmp_path / f"x{i}.npy"]
    proc = run(kiln, "run", pte, *args, "--output", y)
    assert proc.returncode == 0 and "runtime error" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    compare([np.load(y)], refs, "a chain of 12 diffs with prepend / append")


# fuzz_pt2_graph: schema_version {"major": 2.07e55} went through nlohmann's value("major", 0), a float converted
# to int out of its range (UBSan: undefined behaviour); a string there, a number as a module_call_graph entry's
# "fqn" or as a weight's "use_pickle", and a string or float as the subclass-part fields kiln reads
# (kiln_member_offset/bytes, kiln_element_bytes) would each have thrown nlohmann's type_error out of read_pt2.
# Now: the schema version's part is "?" unless an integer, an entry whose fqn is not a string is not the root's,
# and the fields are checked (one error line naming the weight).
def _tiny_pt2(tmp_path: Path) -> Path:
    import torch

    pt2 = tmp_path / "tiny.pt2"
    m = torch.nn.Linear(4, 3)
    torch.export.save(torch.export.export(m, (torch.zeros(2, 4),)), pt2)
    return pt2


def _rewrite_json(src: Path, dst: Path, suffix: str, change) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        hits = 0
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith(suffix):
                doc = json.loads(data)
                change(doc)
                data = json.dumps(doc).encode()
                hits += 1
            zout.writestr(info, data)
        assert hits == 1, (suffix, hits)


@pytest.mark.parametrize("case", ["float_major", "string_minor", "numeric_fqn"])
def test_graph_fields_of_the_wrong_type_are_read_safely(kiln, tmp_path, case):
    pt2 = _tiny_pt2(tmp_path)
    bad = tmp_path / "bad.pt2"

    def change(doc):
        if case == "float_major":
            doc["schema_version"] = {"major": 2.06759e55, "minor": 1.5}
        elif case == "string_minor":
            doc["schema_version"] = {"major": "eight", "minor": "x"}
        else:
            for entry in doc["graph_module"]["module_call_graph"]:
                entry["fqn"] = 5
    _rewrite_json(pt2, bad, "models/model.json", change)
    proc = run(kiln, "inspect", bad)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    good = run(kiln, "inspect", pt2)
    # the same graph either way (the version line and the root call's specs aside)
    assert [line for line in proc.stdout.splitlines() if "aten." in line] == \
        [line for line in good.stdout.splitlines() if "aten." in line]


@pytest.mark.parametrize("field, value, reason", [("use_pickle", 3, "expected a boolean"),
                                                  ("kiln_member_offset", "x", "expected an integer"),
                                                  ("kiln_member_offset", 2.5e40, "expected an integer"),
                                                  ("kiln_member_offset", -1, "kiln_member_offset is negative")])
def test_weight_config_fields_of_the_wrong_type_are_one_error_line(kiln, tmp_path, field, value, reason):
    pt2 = _tiny_pt2(tmp_path)
    bad = tmp_path / "bad.pt2"

    def change(doc):
        for meta in doc["config"].values():
            meta[field] = value
            if field == "kiln_member_offset":
                meta["kiln_member_bytes"] = 12
                meta["kiln_element_bytes"] = 4
    _rewrite_json(pt2, bad, "model_weights_config.json", change)
    before = listing(tmp_path)
    proc = run(kiln, "inspect", bad)
    assert_refused(proc, reason)
    assert listing(tmp_path) == before
