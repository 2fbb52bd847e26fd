"""Regression tests for what the fuzzers (fuzz/*.cpp, scripts/fuzz, docs/FUZZING.md) found: each input
goes through the kiln command that reads that kind of file, in the release build and in the sanitizer
build (build-asan/kiln: ASan + UBSan + LeakSanitizer report what a plain run would not), and must end
with exit status 1, exactly one stderr line "kiln: error: ..." naming the reason, and no file written."""
from __future__ import annotations

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
