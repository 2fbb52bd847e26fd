"""torchao's side of kiln's quantization checks (a peer, outside kiln): a module quantized by torchao's
`quantize_` under the rules `kiln lower --quantize` follows, for PyTorch eager and for ExecuTorch's lowering.

- `conv1d_to_linear(module)`: transformers' GPT-2 computes its projections with `Conv1D` (x @ W[in, out] + b),
  which `quantize_` does not touch; each becomes the equal `nn.Linear` (weight W^T), in place.
- `untie_head(head)`: a tied LM head gets a parameter of its own, so `quantize_` quantizes it and the
  embedding lookup keeps the fp32 table (what kiln's `--quantize` does to a tied head).
- `quantize_like_kiln(module, scheme, group=32, bf16_scales=True)`: `Int8DynamicActivationIntxWeightConfig`,
  int4 `PerGroup(group)` for 8da4w or int8 `PerAxis(0)` for 8da8w, on every nn.Linear. With bf16_scales the
  int4 group scales are rounded to bf16, as ExecuTorch's XNNPACK payload (kiln's and ExecuTorch's) stores
  them, so eager computes the product the file holds (for the eager oracle; not for ExecuTorch's lowering,
  which does its own rounding).
"""
from __future__ import annotations


def conv1d_to_linear(parent):
    import torch
    from transformers.pytorch_utils import Conv1D

    for name, child in parent.named_children():
        if isinstance(child, Conv1D):
            lin = torch.nn.Linear(child.weight.shape[0], child.weight.shape[1])
            with torch.no_grad():
                lin.weight.copy_(child.weight.t())
                lin.bias.copy_(child.bias)
            setattr(parent, name, lin)
        else:
            conv1d_to_linear(child)
    return parent


def untie_head(head):
    import torch

    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    return head


def quantize_like_kiln(module, scheme: str, group: int = 32, bf16_scales: bool = True):
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerAxis, PerGroup, quantize_

    if scheme == "8da4w":
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group))
    elif scheme == "8da8w":
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    else:
        raise ValueError(f"unknown scheme {scheme!r}")
    quantize_(module, cfg)
    if scheme == "8da4w" and bf16_scales:
        with torch.no_grad():
            for m in module.modules():
                if isinstance(m, torch.nn.Linear) and hasattr(m.weight, "scale"):
                    m.weight.scale.copy_(m.weight.scale.to(torch.bfloat16).to(m.weight.scale.dtype))
    return module
