"""kiln.load / kiln.Tokenizer / kiln.generate: kiln's runtime (src/runtime, src/llm) from Python."""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import _kiln
from ._kiln import Error
from ._lower import LoweredProgram, _one_line

PathLike = Union[str, "os.PathLike[str]"]


def _is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # never imported here: a torch tensor means the caller has
    return torch is not None and isinstance(x, torch.Tensor)


def _program_path(program: Any, keep: list) -> str:
    """A path to the program's bytes: the caller's file, or a private file that is removed once mapped."""
    if isinstance(program, LoweredProgram):
        return program._result.pte_path
    if isinstance(program, (str, os.PathLike)):
        return os.fspath(program)
    if isinstance(program, (bytes, bytearray, memoryview)):
        fd, path = tempfile.mkstemp(prefix="kiln-", suffix=".pte")
        with os.fdopen(fd, "wb") as f:
            f.write(program)
        keep.append(path)
        return path
    raise Error(f"kiln.load takes a .pte path, the program's bytes or a kiln.LoweredProgram, not "
                f"{type(program).__name__}")


class Module:
    """A loaded ExecuTorch program (kiln.load): its methods are callables.

    module.forward(*inputs) runs "forward"; module.<name>(*inputs) any other method (constant methods
    such as get_max_seq_len take nothing and return their value). Inputs are numpy arrays or torch tensors
    (CPU, contiguous, the program's dtypes); where the program allows it (kiln's programs always do) the
    runtime reads them in place, without a copy, and an input the program updates in place (an external
    KV cache) is updated in your array. Outputs come back as a list of new numpy arrays, or torch tensors
    when any input was one. A method's state (mutable buffers: an LLM's KV cache) is kept across calls.
    """

    def __init__(self, program: Any, threads: int = 1, engine: str = "kiln"):
        keep: list = []
        try:
            path = _program_path(program, keep)
            with _one_line():
                # engine "xnnpack" hands inputs to XNNPACK's own operators, which may read a few bytes past a
                # tensor's end: only kiln's engine reads the caller's memory in place
                self._program = _kiln.load(path, int(threads), engine, engine == "kiln")
        finally:
            for p in keep:  # mapped: the file's name is no longer needed
                os.unlink(p)
        with _one_line():
            self.method_names: List[str] = list(self._program.method_names())

    def _call(self, method: str, inputs: Sequence[Any]) -> list:
        torch_out = False
        args = []
        for x in inputs:
            if _is_torch_tensor(x):
                torch_out = True
                if x.requires_grad:
                    x = x.detach()  # the same memory
                if x.device.type != "cpu":
                    raise Error(f"method '{method}': an input on {x.device}: kiln runs on the CPU")
            elif not isinstance(x, np.ndarray):
                x = np.asarray(x)
            args.append(x)
        with _one_line():
            outs = self._program.call(method, args)
        if torch_out:
            import torch  # the caller's: an input was a torch tensor

            outs = [torch.from_numpy(o) if isinstance(o, np.ndarray) else o for o in outs]
        return outs

    def forward(self, *inputs: Any) -> list:
        """Runs the program's "forward" method; returns its outputs (a list)."""
        return self._call("forward", inputs)

    def __call__(self, *inputs: Any) -> list:
        return self._call("forward", inputs)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self.__dict__.get("method_names", ()):
            raise AttributeError(name)
        return lambda *inputs: self._call(name, inputs)

    def last_call(self, method: str = "forward") -> dict:
        """What the runtime read in the method's last call: "input_data_ptrs", the address each input
        tensor of the method pointed at while it ran, and "in_place", whether that was the caller's own
        memory (True) or the method's planned memory the input was copied into (False)."""
        with _one_line():
            return {"input_data_ptrs": list(self._program.last_input_data(method)),
                    "in_place": list(self._program.last_shared(method))}


def load(program: Any, threads: int = 1, engine: str = "kiln") -> Module:
    """Loads an ExecuTorch program (kiln's or ExecuTorch's own) with kiln's runtime.

    Args:
        program: a .pte path, the program's bytes, or a kiln.LoweredProgram.
        threads: threads of the XNNPACK delegates.
        engine: how XNNPACK delegates run: "kiln" (kiln's own steps) or "xnnpack" (XNNPACK's operators).

    Returns:
        A kiln.Module (module.forward(*inputs), module.<method>(...)).

    Raises:
        kiln.Error: the file does not load, a method does not prepare, an input does not fit.
    """
    return Module(program, threads=threads, engine=engine)


class Tokenizer:
    """kiln's tokenizer, read from `path`: a Hugging Face tokenizer.json (byte-level BPE, SentencePiece-style
    BPE) or a SentencePiece tokenizer.model. encode(text) -> ids, decode(ids) -> text, vocab_size, bos_id,
    eos_id. Raises kiln.Error when the file does not load."""

    def __init__(self, path: PathLike):
        with _one_line():
            self._tok = _kiln.load_tokenizer(os.fspath(path))

    def encode(self, text: str, special: bool = True) -> List[int]:
        """Token ids of `text` (special: added tokens in the text are recognized)."""
        with _one_line():
            return list(self._tok.encode(text, special))

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of `ids` (bytes that do not form UTF-8 read as U+FFFD)."""
        with _one_line():
            return self._tok.decode([int(i) for i in ids], skip_special).decode("utf-8", "replace")

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    @property
    def bos_id(self) -> Optional[int]:
        return self._tok.bos_id

    @property
    def eos_id(self) -> Optional[int]:
        return self._tok.eos_id


def generate(program: PathLike, prompt: str, tokenizer: Union[PathLike, Tokenizer], max_new_tokens: int = 64,
             temperature: float = 0.0, seed: int = 0, threads: int = 1, engine: str = "kiln") -> Iterator[str]:
    """Generates text from an LLM program (forward(tokens, input_pos) -> logits, its KV cache kept across
    calls or passed as inputs: what `kiln_export llm` exports and `kiln generate` runs), yielding the text
    as it streams, one piece per token (a piece can be empty while a character's bytes are incomplete).

    Args:
        program: the .pte path.
        prompt: the text, tokenized as is (apply a chat template first if needed); a SentencePiece
            tokenizer's BOS token is put in front, as `kiln generate` does.
        tokenizer: a kiln.Tokenizer or its file (tokenizer.json, tokenizer.model).
        max_new_tokens: at most this many tokens; generation also stops at an end-of-sequence token (the
            program's get_eos_ids, else the tokenizer's) or at the program's max_seq_len.
        temperature: 0 is greedy; otherwise softmax sampling at that temperature, with numpy's generator
            seeded by `seed`.
        threads: threads of the XNNPACK delegates. engine: "kiln" or "xnnpack", as kiln.load's.

    Yields:
        The new text, piece by piece (str).

    Raises:
        kiln.Error: the program does not load or is not an LLM program, a call fails.
    """
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
    with _one_line():
        runner = _kiln.load_runner(os.fspath(program), int(threads), engine)
    ids = tok.encode(prompt)
    if tok.bos_id is not None:  # as `kiln generate`: a SentencePiece model's prompts start with BOS
        ids = [tok.bos_id] + ids
    # stop tokens as `kiln generate`'s: the program's eos ids, else the tokenizer's eos token
    eos = set(runner.eos_ids) or ({tok.eos_id} if tok.eos_id is not None else set())
    rng = np.random.default_rng(seed)
    with _one_line():
        logits = runner.feed(ids)
    new: List[int] = []
    shown = ""
    for _ in range(max_new_tokens):
        if temperature <= 0:
            nxt = int(np.argmax(logits))
        else:
            z = logits.astype(np.float64) / temperature
            p = np.exp(z - z.max())
            nxt = int(rng.choice(p.size, p=p / p.sum()))
        if nxt in eos:
            break
        new.append(nxt)
        text = tok.decode(new, skip_special=True)
        stable = text[:-1] if text.endswith("\ufffd") else text  # a character's bytes may still be coming
        if stable.startswith(shown):
            yield stable[len(shown):]
            shown = stable
        if runner.position >= runner.max_seq_len:
            break
        with _one_line():
            logits = runner.feed([nxt])
    text = tok.decode(new, skip_special=True)
    if text.startswith(shown) and len(text) > len(shown):
        yield text[len(shown):]
