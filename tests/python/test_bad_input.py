"""Bad input gets one line on stderr and a non-zero exit, never a crash."""
from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from conftest import run_kiln


def assert_clean_failure(proc, *needles):
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # negative would mean a signal
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kiln: error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    assert proc.stdout == ""


@pytest.fixture(scope="module")
def pt2(tmp_path_factory):
    from conftest import export_model

    spec = export_model(tmp_path_factory.mktemp("bad_input_src"), "--config", "tiny", "--seq-len", "8")
    return spec.parent / "gpt2.pt2"


def rewrite(src: Path, dst: Path, edit):
    """Copies the archive entry by entry; edit(name, data) returns new bytes or None to drop."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)
    return dst


def test_truncated_archive(pt2, tmp_path):
    bad = tmp_path / "truncated.pt2"
    bad.write_bytes(pt2.read_bytes()[: pt2.stat().st_size // 2])
    assert_clean_failure(run_kiln("inspect", bad, check=False), str(bad), "not a readable .pt2 archive")


def test_archive_without_graph(pt2, tmp_path):
    bad = rewrite(pt2, tmp_path / "nograph.pt2", lambda n, d: None if n.endswith("models/model.json") else d)
    assert_clean_failure(run_kiln("inspect", bad, check=False), "no serialized graph")


def test_unknown_argument_kind(pt2, tmp_path):
    def edit(name, data):
        if not name.endswith("models/model.json"):
            return data
        doc = json.loads(data)
        node = doc["graph_module"]["graph"]["nodes"][0]
        node["inputs"][1]["arg"] = {"as_hologram": [1, 2]}
        return json.dumps(doc).encode()

    bad = rewrite(pt2, tmp_path / "badkind.pt2", edit)
    proc = run_kiln("inspect", bad, check=False)
    assert_clean_failure(proc, "unknown argument kind 'as_hologram'", "node '")


def test_weight_shorter_than_metadata(pt2, tmp_path):
    bad = rewrite(pt2, tmp_path / "short.pt2", lambda n, d: d[: len(d) // 2] if n.endswith("weights/weight_1") else d)
    assert_clean_failure(run_kiln("inspect", bad, check=False), "weight_1", "but its metadata needs")


def test_missing_pt2_path(tmp_path):
    assert_clean_failure(run_kiln("inspect", tmp_path / "nope.pt2", check=False), "not found")


def test_missing_spec(tmp_path):
    assert_clean_failure(run_kiln("inspect", tmp_path / "model_spec.json", check=False), "model spec not found")


def test_spec_naming_a_missing_pt2(pt2, tmp_path):
    spec = json.loads((pt2.parent / "model_spec.json").read_text())
    spec["exported_program"] = "elsewhere.pt2"
    (tmp_path / "model_spec.json").write_text(json.dumps(spec))
    assert_clean_failure(run_kiln("inspect", tmp_path / "model_spec.json", check=False), "elsewhere.pt2", "not found")


def test_malformed_graph_json(pt2, tmp_path):
    bad = rewrite(pt2, tmp_path / "badjson.pt2",
                  lambda n, d: d[: len(d) // 3] if n.endswith("models/model.json") else d)
    assert_clean_failure(run_kiln("inspect", bad, check=False), "invalid JSON")


def test_a_copy_of_the_good_archive_reads(pt2, tmp_path):
    # The rewrite helper itself preserves a valid archive: the failures above come from the edits.
    good = rewrite(pt2, tmp_path / "copy.pt2", lambda n, d: d)
    assert run_kiln("inspect", good).returncode == 0
    shutil.rmtree(tmp_path, ignore_errors=True)
