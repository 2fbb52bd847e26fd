"""Runs one kiln kernel through the test-only kernel_runner binary (one process, kept: `--serve`).

Tests build the arguments from torch tensors, call run_kernel, and compare the
out tensors with what torch computed for the same inputs.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(os.environ.get("KILN_KERNEL_RUNNER", REPO / "build" / "kiln_kernel_runner"))


def _num(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def T(t: torch.Tensor) -> dict:
    """A tensor argument (any dtype torch and kiln share)."""
    t = t.detach().contiguous()
    data = t.to(torch.float64).flatten().tolist() if t.is_floating_point() else t.flatten().tolist()
    return {"tensor": {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                       "data": [_num(v) for v in data]}}


def out_like(t: torch.Tensor) -> dict:
    """An out-tensor argument shaped and typed like `t` (contents are garbage-filled)."""
    filler = torch.full_like(t, 7) if t.dtype != torch.bool else torch.ones_like(t)
    return T(filler)


def Int(v): return {"int": int(v)}
def Double(v): return {"double": _num(float(v))}
def Bool(v): return {"bool": bool(v)}
def Str(v): return {"string": v}
def Ints(v): return {"ints": [int(x) for x in v]}
def Doubles(v): return {"doubles": [_num(float(x)) for x in v]}
def Bools(v): return {"bools": [bool(x) for x in v]}
NONE = {"none": None}
def Tensors(ts): return {"tensors": [T(t)["tensor"] for t in ts]}
def OptTensors(ts): return {"optional_tensors": [None if t is None else T(t)["tensor"] for t in ts]}


class KernelError(Exception):
    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
           "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}


def _to_torch(o: dict) -> torch.Tensor:
    dt = _DTYPES[o["dtype"]]
    vals = [float(v) if isinstance(v, str) else v for v in o["data"]]
    if dt.is_floating_point:
        return torch.tensor(np.array(vals, dtype=np.float64)).to(dt).reshape(o["shape"])
    return torch.tensor(vals, dtype=dt).reshape(o["shape"])


_server: subprocess.Popen | None = None


def _stop_server() -> None:
    global _server
    if _server is not None:
        try:
            _server.stdin.close()  # the runner ends at the end of its input
        except OSError:
            pass
        _server.wait()
        _server = None


atexit.register(_stop_server)


def _request(req: str) -> dict:
    """One request to the runner this process keeps (`kernel_runner --serve`: a request per line, a response
    per line), started on first use and again after a crash: a process per kernel call cost the kernel tables
    (5,700 calls) most of their time."""
    global _server
    if _server is None:
        _server = subprocess.Popen([str(RUNNER), "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, bufsize=1)
    try:
        _server.stdin.write(req + "\n")
        _server.stdin.flush()
        line = _server.stdout.readline()
    except BrokenPipeError:
        line = ""
    if not line:  # the runner died on this call (a crash in the kernel): the next call starts a new one
        proc, _server = _server, None
        raise RuntimeError(f"kernel_runner crashed ({proc.wait()}) on {req[:200]}")
    res = json.loads(line)
    if "bad_request" in res:
        raise RuntimeError(f"kernel_runner rejected input: {res['bad_request']}")
    return res


def run_kernel(op: str, overload: str, args: list, outs: list[int]) -> list[torch.Tensor]:
    """Runs kernel `op`.`overload` on `args`; returns the tensors at indices `outs`.

    Raises KernelError when the kernel reports a failure (status and message)."""
    if not RUNNER.is_file():
        raise RuntimeError(f"kernel runner not built at {RUNNER}")
    res = _request(json.dumps({"op": op, "overload": overload, "args": args, "outs": outs}))
    if not res["ok"]:
        raise KernelError(res["status"], res["message"])
    return [_to_torch(o) for o in res["outs"]]
