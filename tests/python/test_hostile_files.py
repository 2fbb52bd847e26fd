"""Model files are untrusted input (issue 36): hostile or careless files and flags get one line
`kiln: error: ...` on stderr and exit 1, and leave no file behind; outputs go through unique staged
files renamed into place, and concurrent lowerings to one path leave one complete, consistent set."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import _kiln_bin, export_model, run_kiln


def assert_clean_failure(proc, *needles):
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # negative would mean a signal
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kiln: error: "), lines[0]
    assert "internal:" not in lines[0], lines[0]
    for n in needles:
        assert n in lines[0], lines[0]


def listing(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Tiny GPT-2 (seq_len 8): its spec, .pt2 and eager PyTorch's reference input/output."""
    spec = export_model(tmp_path_factory.mktemp("hostile_src"), "--config", "tiny", "--seq-len", "8")
    d = spec.parent
    return {"spec": spec, "pt2": d / "gpt2.pt2", "input": d / "gpt2_input0.npy",
            "expected": np.load(d / "gpt2_expected_output0.npy")}


@pytest.fixture(scope="module")
def portable_pte(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile_pte") / "gpt2_portable.pte"
    run_kiln("lower", "--spec", model["spec"], "--backend", "portable", "--out", out, "-q")
    return out


def logits_of(pte: Path, model, tmp: Path) -> np.ndarray:
    out = tmp / f"logits_{pte.stem}.npy"
    run_kiln("run", pte, "--input", model["input"], "--output", out)
    got = np.load(out)
    out.unlink()
    return got


def spec_copy(model, tmp: Path, **fields) -> Path:
    spec = json.loads(model["spec"].read_text())
    spec["exported_program"] = str(model["pt2"])
    spec["inputs"] = spec["outputs"] = []
    spec.update(fields)
    path = tmp / "model_spec.json"
    path.write_text(json.dumps(spec))
    return path


def check_set(pte: Path):
    """The .pte, its metadata and its debug map exist and describe the same file."""
    data = pte.read_bytes()
    meta = json.loads(pte.with_suffix(".json").read_text())
    debug = json.loads(pte.with_suffix(".debug.json").read_text())
    digest = hashlib.sha256(data).hexdigest()
    assert meta["pte_sha256"] == digest and meta["pte_size_bytes"] == len(data), "metadata describes another .pte"
    assert debug["pte_sha256"] == digest and debug["backend"] == meta["backend"], "debug map describes another .pte"
    return meta


# ---- outputs: staged files, planted links, published sets ----------------------------------------

def test_lower_records_the_pte_digest(model, portable_pte):
    meta = check_set(portable_pte)
    assert meta["backend"] == "portable"


def test_planted_links_are_not_followed(model, portable_pte, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    pte = out / "x.pte"
    # the fixed names kiln used to stage through, and the outputs themselves, as links to the victim
    planted = ["x.pte.kiln-staging", "x.pte.kiln-staging.tmp", "x.json.kiln-tmp", "x.debug.json.kiln-tmp",
               "x.pte", "x.json", "x.debug.json", "y.npy", "y.npy.kiln-tmp"]
    for name in planted:
        (out / name).symlink_to(victim)
    run_kiln("lower", "--spec", model["spec"], "--out", pte, "-q")
    run_kiln("run", portable_pte, "--input", model["input"], "--output", out / "y.npy")
    assert victim.read_text() == "precious\n"
    for name in ["x.pte", "x.json", "x.debug.json", "y.npy"]:  # replaced by regular files, links not followed
        assert not (out / name).is_symlink() and (out / name).is_file(), name
    check_set(pte)
    np.testing.assert_allclose(np.load(out / "y.npy"), model["expected"], rtol=1e-4, atol=1e-4)
    assert listing(out) == set(planted) | {"x.pte", "x.json", "x.debug.json", "y.npy"}  # no staged file left


# Concurrent lowerings to one --out: tests/python/test_concurrent_lower.py (a small MLP, 100 rounds, each
# round's published set checked for consistency and run against eager PyTorch).


def full_disk_lower(model, tmp_path, size_bytes: int):
    """kiln lower onto a tmpfs of `size_bytes` (a user+mount namespace: no privilege needed where
    unprivileged user namespaces are allowed; where they are not, the test fails rather than skips); returns (kiln's exit code, stderr, files left)."""
    if shutil.which("unshare") is None:
        pytest.fail("no unshare(1) (util-linux) to mount a small tmpfs: this test needs it")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    script = (f'mount -t tmpfs -o size={size_bytes} tmpfs "{mnt}" || exit 97; '
              f'"{_kiln_bin()}" lower --spec "{model["spec"]}" --out "{mnt}/m.pte" -q; rc=$?; '
              f'echo "rc=$rc"; ls -a "{mnt}"')
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True)
    if proc.returncode == 97 or "rc=" not in proc.stdout:
        pytest.fail(f"cannot mount a tmpfs in a user namespace here: {proc.stderr.strip()[:200]}")
    _, _, tail = proc.stdout.rpartition("rc=")  # after kiln's own stdout
    head, _, files = tail.partition("\n")
    return int(head), proc.stderr, set(files.split()) - {".", ".."}


def test_full_disk_while_writing_the_debug_map_leaves_nothing(model, portable_pte, tmp_path):
    pte_size = portable_pte.stat().st_size
    map_size = portable_pte.with_suffix(".debug.json").stat().st_size
    page = 4096
    room = (pte_size + page - 1) // page * page + page  # the .pte fits, its debug map does not
    assert map_size > 2 * page, map_size  # else this size would not put the failure in the debug map
    rc, err, left = full_disk_lower(model, tmp_path, room)
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: error: "), err
    assert "m.debug.json" in lines[0] and "No space left" in lines[0], lines[0]
    assert left == set(), left
    # and with room for everything the same command succeeds (the failure above is the disk's)
    (tmp_path / "big").mkdir()
    rc, err, left = full_disk_lower(model, tmp_path / "big", 64 << 20)
    assert rc == 0, err
    assert left == {"m.pte", "m.json", "m.debug.json"}, left


# ---- the spec's name is a file name ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["../escape", "/tmp/kiln-abs-escape", "", ".", "..", "a/b", "a\\b", "a\u0000b",
                                  "a\nb", "x" * 300])
def test_spec_name_is_a_file_name(model, tmp_path, name):
    spec = spec_copy(model, tmp_path, name=name)
    before = listing(tmp_path), listing(tmp_path.parent)
    proc = run_kiln("lower", "--spec", spec, "-q", check=False)
    assert_clean_failure(proc, "'name' must be a file name")
    assert (listing(tmp_path), listing(tmp_path.parent)) == before
    assert not Path("/tmp/kiln-abs-escape_portable.pte").exists()


# ---- .pt2 zip archives ----------------------------------------------------------------------------

def rewrite(src: Path, dst: Path, compression=zipfile.ZIP_STORED, extra=(), **kw):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression, **kw) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
        for name, data in extra:
            zout.writestr(name, data)
    return dst


def lower_pt2(model, tmp_path, pt2: Path, *extra):
    spec = json.loads(model["spec"].read_text())
    spec["exported_program"] = str(pt2)
    spec["inputs"] = spec["outputs"] = []
    (tmp_path / "model_spec.json").write_text(json.dumps(spec))
    return run_kiln("lower", "--spec", tmp_path / "model_spec.json", "--out", tmp_path / "m.pte", "-q", *extra,
                    check=False)


def test_deflated_archive_lowers_and_runs(model, tmp_path):
    pt2 = rewrite(model["pt2"], tmp_path / "deflated.pt2", zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(pt2) as z:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    proc = lower_pt2(model, tmp_path, pt2)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(logits_of(tmp_path / "m.pte", model, tmp_path), model["expected"], rtol=1e-4, atol=1e-4)


def test_mapped_and_libzip_reads_give_the_same_program(model, tmp_path):
    """kiln reads stored entries from a mapping of the file (its own reading of the zip directory) and compressed
    ones through libzip: torch's archive as written, a copy with every entry deflated (libzip only) and a zip64 copy
    (the mapping through zip64 records) must lower to byte-identical programs."""
    forms = {"stored": model["pt2"], "deflated": rewrite(model["pt2"], tmp_path / "d.pt2", zipfile.ZIP_DEFLATED)}
    with zipfile.ZipFile(model["pt2"]) as zin, zipfile.ZipFile(tmp_path / "z64.pt2", "w") as zout:
        for info in zin.infolist():
            with zout.open(info.filename, "w", force_zip64=True) as f:
                f.write(zin.read(info.filename))
    forms["zip64"] = tmp_path / "z64.pt2"
    programs = {}
    for name, pt2 in forms.items():
        work = tmp_path / name
        work.mkdir()
        proc = lower_pt2(model, work, pt2)
        assert proc.returncode == 0, proc.stderr
        programs[name] = (work / "m.pte").read_bytes()
    assert programs["deflated"] == programs["stored"]
    assert programs["zip64"] == programs["stored"]


def test_zip64_archive_lowers(model, tmp_path):
    src = model["pt2"]
    dst = tmp_path / "zip64.pt2"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            with zout.open(info.filename, "w", force_zip64=True) as f:
                f.write(zin.read(info.filename))
    proc = lower_pt2(model, tmp_path, dst)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(logits_of(tmp_path / "m.pte", model, tmp_path), model["expected"], rtol=1e-4, atol=1e-4)


def test_zip_bomb_entry_is_refused(model, tmp_path):
    bomb = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(model["pt2"]) as zin, zipfile.ZipFile(bomb, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
        zi = zipfile.ZipInfo("gpt2/data/weights/zeros")
        zi.compress_type = zipfile.ZIP_DEFLATED
        with zout.open(zi, "w") as f:
            chunk = bytes(1 << 20)
            for _ in range(64):
                f.write(chunk)
    assert bomb.stat().st_size < 2 * model["pt2"].stat().st_size
    proc = run_kiln("inspect", bomb, check=False)
    assert_clean_failure(proc, "zeros", "zip bomb")
    assert_clean_failure(lower_pt2(model, tmp_path, bomb), "zip bomb")
    assert listing(tmp_path) == {"bomb.pt2", "model_spec.json"}


def patch_sizes(path: Path, entry: str, size: int):
    """Rewrites an entry's declared uncompressed size in its local header and central directory."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(entry)
    local = info.header_offset
    assert data[local:local + 4] == b"PK\x03\x04"
    struct.pack_into("<I", data, local + 22, size)
    name = entry.encode()
    pos = data.find(b"PK\x01\x02")
    while pos >= 0:
        n = struct.unpack_from("<H", data, pos + 28)[0]
        if data[pos + 46:pos + 46 + n] == name:
            struct.pack_into("<I", data, pos + 24, size)
            break
        pos = data.find(b"PK\x01\x02", pos + 4)
    assert pos >= 0
    path.write_bytes(bytes(data))


def test_deflated_entry_declaring_4gb_is_refused(model, tmp_path):
    pt2 = rewrite(model["pt2"], tmp_path / "liar.pt2", zipfile.ZIP_DEFLATED)
    patch_sizes(pt2, "gpt2/models/model.json", 0xFFFFFFF0)
    proc = run_kiln("inspect", pt2, check=False)
    assert_clean_failure(proc, "model.json")


def test_stored_entry_declaring_another_size_is_refused(model, tmp_path):
    pt2 = rewrite(model["pt2"], tmp_path / "liar.pt2")
    patch_sizes(pt2, "gpt2/data/weights/weight_1", 1 << 30)
    assert_clean_failure(run_kiln("inspect", pt2, check=False), "weight_1")
    assert_clean_failure(lower_pt2(model, tmp_path, pt2), "weight_1")
    assert listing(tmp_path) == {"liar.pt2", "model_spec.json"}


@pytest.mark.parametrize("name", ["../evil", "/abs/evil", "gpt2/../../evil", "gpt2\\evil"])
def test_traversal_entry_names_are_refused(model, tmp_path, name):
    pt2 = rewrite(model["pt2"], tmp_path / "t.pt2", extra=[(name, b"x")])
    assert_clean_failure(run_kiln("inspect", pt2, check=False), "name kiln refuses")


def test_duplicate_entry_names_are_refused(model, tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate it is asked to write
        pt2 = rewrite(model["pt2"], tmp_path / "dup.pt2", extra=[("gpt2/data/weights/weight_1", bytes(65536))])
    # libzip's consistency check (ZIP_CHECKCONS) refuses it first; kiln's own check names the entry
    assert_clean_failure(run_kiln("inspect", pt2, check=False), "dup.pt2", "not a readable .pt2 archive")


def test_parameter_with_2_to_64_elements_is_refused(model, tmp_path):
    def edit(name, data):
        if not name.endswith("models/model.json"):
            return data
        doc = json.loads(data)
        tv = doc["graph_module"]["graph"]["tensor_values"]
        tv["p_model_transformer_wte_weight"]["sizes"] = [{"as_int": 1 << 32}, {"as_int": 1 << 32}]
        return json.dumps(doc).encode()

    pt2 = tmp_path / "huge.pt2"
    with zipfile.ZipFile(model["pt2"]) as zin, zipfile.ZipFile(pt2, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, edit(info.filename, zin.read(info.filename)))
    assert_clean_failure(run_kiln("inspect", pt2, check=False), "more elements than a 64-bit count")


# ---- .npy inputs ----------------------------------------------------------------------------------

def npy_bytes(descr: str, shape: str, payload: bytes) -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


@pytest.mark.parametrize("shape,payload,needle", [
    ("(1, -16)", bytes(128), "not a non-negative integer"),
    ("(4294967296, 4294967296)", bytes(128), "more elements than can be counted"),
    ("(99999999999999999999999,)", bytes(128), "not a non-negative integer"),
    ("(1, 8)", bytes(64 + 8), "needs 64 data bytes, the file holds 72"),
    ("(1, 8)", bytes(56), "needs 64 data bytes, the file holds 56"),
    ("(1, 2305843009213693952)", bytes(64), "more bytes than can be counted"),
    ("1, 8", bytes(64), "malformed .npy shape"),
])
def test_bad_npy_input(model, portable_pte, tmp_path, shape, payload, needle):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(npy_bytes("<i8", shape, payload))
    proc = run_kiln("run", portable_pte, "--input", bad, "--output", tmp_path / "out.npy", check=False)
    assert_clean_failure(proc, "bad.npy", needle)
    assert listing(tmp_path) == {"bad.npy"}


def test_good_npy_header_form_reads(model, portable_pte, tmp_path):
    # the writer above is right: a well-formed header of the same form runs and gives eager PyTorch's answer
    tokens = np.load(model["input"])
    good = tmp_path / "good.npy"
    good.write_bytes(npy_bytes("<i8", "(1, 8)", tokens.astype("<i8").tobytes()))
    run_kiln("run", portable_pte, "--input", good, "--output", tmp_path / "out.npy")
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), model["expected"], rtol=1e-4, atol=1e-4)


# ---- kiln run's outputs ---------------------------------------------------------------------------

def test_run_steps_failure_leaves_no_earlier_outputs(model, portable_pte, tmp_path):
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((1, 3), dtype=np.int64))
    proc = run_kiln("run", portable_pte, "--steps", "2", "--input", model["input"], "--input", wrong,
                    "--output", tmp_path / "o0.npy", "--output", tmp_path / "o1.npy", check=False)
    assert_clean_failure(proc, "wrong.npy")
    assert listing(tmp_path) == {"wrong.npy"}


def test_run_output_to_a_directory(model, portable_pte, tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    proc = run_kiln("run", portable_pte, "--input", model["input"], "--output", d, check=False)
    assert_clean_failure(proc, "is a directory")
    assert listing(tmp_path) == {"adir"} and listing(d) == set()


def test_run_output_in_a_missing_directory(model, portable_pte, tmp_path):
    proc = run_kiln("run", portable_pte, "--input", model["input"], "--output", tmp_path / "no" / "o.npy",
                    check=False)
    assert_clean_failure(proc, "No such file or directory")
    assert listing(tmp_path) == set()


# ---- threads, usage errors ------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["run"], ["bench"], ["profile"]])
@pytest.mark.parametrize("threads", ["0", "20000", "-3"])
def test_threads_cap(model, portable_pte, command, threads):
    proc = run_kiln(*command, portable_pte, f"--threads={threads}", check=False)
    assert_clean_failure(proc, f"--threads {threads}", "thread counts go from 1 to")


def test_threads_cap_generate_and_bench_llm(portable_pte):
    assert_clean_failure(run_kiln("generate", portable_pte, "--threads", "20000", "--prompt", "hi", check=False),
                         "--threads 20000")
    assert_clean_failure(run_kiln("bench-llm", portable_pte, "--threads", "1,20000", check=False), "20000")
    if (os.cpu_count() or 1) <= 256:  # within bench-llm's own list form (1..1024), beyond the one cap
        assert_clean_failure(run_kiln("bench-llm", portable_pte, "--threads", "1,300", check=False),
                             "--threads 300", "thread counts go from 1 to 256")


@pytest.mark.parametrize("args", [["lower"], ["run", "--bogus"], ["frobnicate"], ["run"], [],
                                  ["run", "x.pte", "--threads", "abc"], ["run", "x.pte", "--threads", "99999999999999"],
                                  ["lower", "--spec"], ["inspect", "a", "b", "c"]])
def test_usage_errors_are_one_line(args):
    proc = run_kiln(*args, check=False)
    assert_clean_failure(proc)


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["lower", "--help"], ["--version"]])
def test_help_still_exits_0(args):
    proc = run_kiln(*args, check=False)
    assert proc.returncode == 0 and proc.stdout, proc.stderr


# ---- kiln view ------------------------------------------------------------------------------------

def test_view_of_a_corrupt_xnnpack_payload(model, tmp_path):
    pte = tmp_path / "x.pte"
    run_kiln("lower", "--spec", model["spec"], "--backend", "xnnpack", "--out", pte, "-q", "--no-debug-map")
    data = bytearray(pte.read_bytes())
    at = data.find(b"XH00")
    assert at >= 4, "no XNNPACK payload header"
    start = at - 4
    fb_offset, fb_size = struct.unpack_from("<II", data, start + 10)
    # the XNNGraph flatbuffer's root table and vtables: garbage that no verifier accepts
    data[start + fb_offset:start + fb_offset + 64] = b"\xff" * 64
    pte.write_bytes(bytes(data))
    assert run_kiln("inspect", pte, check=False).returncode in (0, 1)  # the .pte container itself may still load
    proc = run_kiln("view", pte, "-o", tmp_path / "x.html", check=False)
    assert_clean_failure(proc, "payload is not a readable XNNGraph")
    assert not (tmp_path / "x.html").exists()
    assert {p.name for p in tmp_path.iterdir()} == {"x.pte", "x.json"}
