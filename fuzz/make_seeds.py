"""Seed corpora for kiln's fuzz targets (fuzz/*.cpp), written to OUT/<target>/ (scripts/fuzz: build-fuzz/seeds).

The seeds are small real files of every kind kiln reads, made the way the tests make theirs:
- pt2: small modules (linear, conv, a buffer and a constant, dynamic shapes, one in bfloat16 and in float16 with
  a strided buffer and one at a storage offset) saved by torch.export, in the default IR and core ATen, stored
  and deflated; pt2_graph: the same archives cut into their text files;
- pte: those programs lowered by kiln (portable and xnnpack) and kiln's hand-built test programs
  (build/kiln_pte_smoke) -- all under 64 KB, so that the fuzzers stay fast;
- model_spec and npy: specs as the export front end writes them, arrays saved by NumPy (versions 1-3);
- tokenizer: tokenizer.json files trained by the `tokenizers` package in the styles the tests use
  (byte-level BPE as GPT-2 / SmolLM2, and tests/python/test_tokenizer.py's SentencePiece styles) and a
  SentencePiece model; chat_template: the templates of tests/python/test_tokenizer.py.
The big test models (tiny GPT-2's 1 MB archive) are left out: one slow seed would slow every run.

    .venv/bin/python fuzz/make_seeds.py OUT [--kiln build/kiln] [--pte-smoke build/kiln_pte_smoke]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write(out: Path, target: str, name: str, data: bytes | str) -> None:
    d = out / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data.encode() if isinstance(data, str) else data)


def export_modules(work: Path) -> list[Path]:
    import warnings

    import torch

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.export's deprecation notes, once per save

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)

        def forward(self, x):
            return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)

    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)

        def forward(self, x):
            return torch.nn.functional.max_pool2d(self.conv(x), 2).flatten(1)

    class State(torch.nn.Module):  # a buffer, a tensor constant, a view, integer ops
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.arange(6, dtype=torch.float32).reshape(2, 3))
            self.emb = torch.nn.Embedding(10, 3)
            self.const = torch.tensor([1.0, -2.0, 3.0])

        def forward(self, ids, x):
            y = self.emb(ids) * self.const + x.transpose(0, 1)[:, :3]
            return (y + self.scale[:1]).sum(-1, keepdim=True), ids.argmax(-1)

    class Dyn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(4)

        def forward(self, x):
            return self.ln(x).cumsum(0) * 2

    class Narrow(torch.nn.Module):  # for a bfloat16 / float16 program: kiln widens its constants as it reads them
        def __init__(self, dtype):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.register_buffer("t", torch.arange(6.0).reshape(2, 3).t())  # a strided (transposed) buffer
            self.register_buffer("tail", torch.arange(8.0)[3:6])  # a slice of a larger storage
            self.to(dtype)
            self.const = torch.tensor([0.5, -1.0, 2.0], dtype=dtype)

        def forward(self, x):
            y = self.fc(x) * self.const + self.tail
            return torch.nn.functional.silu(y) @ self.t + x.float().sum().to(x.dtype)

    torch.manual_seed(0)
    made = []
    cases = [
        ("mlp", Mlp(), (torch.randn(2, 4),), None),
        ("conv", Conv(), (torch.randn(1, 2, 4, 4),), None),
        ("state", State(), (torch.tensor([[1, 2], [3, 4]]), torch.randn(3, 2)), None),
        ("dyn", Dyn(), (torch.randn(6, 4),), {"x": {0: torch.export.Dim("n", min=2, max=16)}}),
        ("bf16", Narrow(torch.bfloat16), (torch.randn(2, 4, dtype=torch.bfloat16),), None),
        ("fp16", Narrow(torch.float16), (torch.randn(2, 4, dtype=torch.float16),), None),
    ]
    for name, module, args, dynamic in cases:
        ep = torch.export.export(module.eval(), args, dynamic_shapes=dynamic)
        for ir, prog in (("default", ep), ("core_aten", ep.run_decompositions())):
            path = work / f"{name}_{ir}.pt2"
            torch.export.save(prog, str(path))
            made.append(path)
            spec = {"name": name, "model_id": f"kiln/fuzz-{name}", "seq_len": 8, "exported_program": path.name,
                    "ir": ir, "inputs": [{"name": f"in{i}", "dtype": str(a.dtype).removeprefix("torch."),
                                          "shape": list(a.shape), "reference": f"{name}_input{i}.npy"}
                                         for i, a in enumerate(args)], "outputs": []}
            (work / f"{name}_{ir}_spec.json").write_text(json.dumps(spec, indent=2))
    return made


def deflated(path: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    return buf.getvalue()


def graph_parts(path: Path) -> bytes:
    """An archive as fuzz/pt2_graph.cpp's input: model.json, the two configs and the payloads, cut at NULs."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        root = names[0].split("/")[0] + "/"
        read = lambda suffix: z.read(root + suffix) if root + suffix in names else b""  # noqa: E731
        parts = [read("models/model.json"), read("data/weights/model_weights_config.json"),
                 read("data/constants/model_constants_config.json")]
        # The harness names the payloads weight_N and tensor_N; rename them so in the configs.
        payloads = {}
        for cfg_index, kind in ((1, "weights"), (2, "constants")):
            if not parts[cfg_index]:
                continue
            cfg = json.loads(parts[cfg_index])
            for meta in cfg.get("config", {}).values():
                old = meta.get("path_name")
                if old is None:
                    continue
                n = len(payloads)
                payloads[n] = z.read(f"{root}data/{kind}/{old}")
                meta["path_name"] = f"weight_{n}" if kind == "weights" else f"tensor_{n}"
            parts[cfg_index] = json.dumps(cfg).encode()
    # NULs separate the parts; a payload's values do not matter to the reader, its size does.
    parts += [payloads[n].replace(b"\0", b"\1") for n in sorted(payloads)]
    return b"\0".join(parts)


def npy_seeds(out: Path) -> None:
    import numpy as np

    arrays = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4), "i64": np.array([[1, 2, 3]], dtype=np.int64),
        "f16": np.ones((2, 2), dtype=np.float16), "bool": np.array([True, False]), "u8": np.arange(5, dtype=np.uint8),
        "scalar": np.array(3.5, dtype=np.float64), "empty": np.zeros((0, 3), dtype=np.int32),
        "i8": np.array([-1, 2], dtype=np.int8), "u16": np.array([7], dtype=np.uint16),
    }
    for name, a in arrays.items():
        buf = io.BytesIO()
        np.save(buf, a)
        write(out, "npy", f"{name}.npy", buf.getvalue())
    for version in ((2, 0), (3, 0)):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, arrays["f32"], version=version)
        write(out, "npy", f"f32_v{version[0]}.npy", buf.getvalue())


def tokenizer_seeds(out: Path, work: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    sys.path.insert(0, str(REPO / "tests" / "python"))
    import test_tokenizer as tt  # the SentencePiece-style files and the chat templates the tests use

    corpus = tt.SP_CORPUS + tt.TEXTS[:2]
    # byte-level BPE with added special tokens (GPT-2, SmolLM2, Llama 3, Qwen style)
    for name, pattern in (("bytelevel", None),
                          ("split_regex", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")):
        tok = Tokenizer(models.BPE())
        if pattern is None:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            from tokenizers import Regex
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(corpus, trainer)
        write(out, "tokenizer", f"{name}.json", tok.to_str())
    for kind in ("llama2", "gemma", "metaspace", "split"):
        path = tt._sp_style(kind, work / f"sp_{kind}.json")
        write(out, "tokenizer", f"sp_{kind}.json", path.read_bytes())
    try:
        import sentencepiece as spm
    except ImportError:
        spm = None
    if spm is not None:
        text = work / "sp_corpus.txt"
        text.write_text("\n".join(tt.SP_CORPUS))
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(work / "sp"), vocab_size=120,
                                       model_type="bpe", byte_fallback=False, minloglevel=2,
                                       normalization_rule_name="identity")  # no 240 KB NFKC table
        write(out, "tokenizer", "sp.model", (work / "sp.model").read_bytes())
    for name in ("LLAMA3", "QWEN", "GEMMA", "KITCHEN_SINK"):
        write(out, "chat_template", f"{name.lower()}.jinja", getattr(tt, name))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--kiln", type=Path, default=REPO / "build" / "kiln")
    ap.add_argument("--pte-smoke", type=Path, default=REPO / "build" / "kiln_pte_smoke")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for pt2 in export_modules(work):
            write(out, "pt2", pt2.name, pt2.read_bytes())
            write(out, "pt2", pt2.stem + "_deflated.pt2", deflated(pt2))
            write(out, "pt2_graph", pt2.stem + ".parts", graph_parts(pt2))
            spec = work / f"{pt2.stem}_spec.json"
            write(out, "model_spec", spec.name, spec.read_bytes())
            for backend in ("portable", "xnnpack"):
                pte = work / f"{pt2.stem}_{backend}.pte"
                proc = subprocess.run([str(args.kiln), "lower", "--spec", str(spec), "--backend", backend,
                                       "--out", str(pte), "-q", "--no-debug-map"], capture_output=True, text=True)
                if proc.returncode == 0:
                    write(out, "pte", pte.name, pte.read_bytes())
                else:
                    print(f"make_seeds: kiln lower {pt2.name} --backend {backend}: {proc.stderr.strip()}")
        if args.pte_smoke.is_file():
            for name, flags in (("smoke", []), ("smoke_planned_input", ["--planned-input"]),
                                ("smoke_extras", ["--extras"])):
                subprocess.run([str(args.pte_smoke), str(work / f"{name}.pte"), *flags], check=True,
                               capture_output=True)
                write(out, "pte", f"{name}.pte", (work / f"{name}.pte").read_bytes())
        gpt2_spec = {"name": "gpt2", "model_id": "kiln/gpt2-tiny", "config": "tiny", "seq_len": 8,
                     "exported_program": "gpt2.pt2", "ir": "default", "seed": 0, "checkpoint": None,
                     "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, 8],
                                 "reference": "gpt2_input0.npy"}],
                     "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, 8, 1000],
                                  "reference": "gpt2_expected_output0.npy"}],
                     "constant_methods": {"get_max_seq_len": 8, "get_eos_ids": [0, 1], "use_kv_cache": False,
                                          "get_name": "gpt2", "temperature": 0.5},
                     "torch_version": "2.13.0+cpu"}
        write(out, "model_spec", "gpt2_spec.json", json.dumps(gpt2_spec, indent=2))
        npy_seeds(out)
        tokenizer_seeds(out, work)
    for d in sorted(out.iterdir()):
        if d.is_dir():
            files = list(d.iterdir())
            print(f"make_seeds: {d.name}: {len(files)} seeds, largest {max(f.stat().st_size for f in files)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
