"""Regression tests for what the fuzzers (fuzz/*.cpp, scripts/fuzz, docs/FUZZING.md) found: each input
goes through the kiln command that reads that kind of file, in the release build and in the sanitizer
build (build-asan/kiln: ASan + UBSan + LeakSanitizer report what a plain run would not), and must end
with exit status 1, exactly one stderr line "kiln: error: ..." naming the reason, and no file written."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

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
