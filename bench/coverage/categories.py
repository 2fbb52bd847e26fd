"""The sweep's other categories (sweep.py --category): in-place variants and torch.nn modules.

inplace   every OpInfo of `op_db` with an in-place variant (`OpInfo.inplace_variant`, e.g. Tensor.add_),
          each sample inside a module that writes it into an intermediate (a clone of the input) and
          into a view of another intermediate (row 1 of a stack of two copies of the input, a select
          view of the same shape); the module returns the mutated intermediate and the view's base,
          so the write through the view must be seen by the base as in eager.
modules   `torch.testing._internal.common_modules.module_db`: every torch.nn module with its
          samples (eval mode, float32), its parameters and buffers as in a model; plus
          parametrizations the database lacks (weight norm).

Each returns the rows `sweep.select_ops` returns: (key, why, generator); the generator is called
as `gen(max_samples)` and gives [(description, nn.Module, example inputs)].
"""
from __future__ import annotations

CATEGORIES = ("ops", "inplace", "modules")


def _sweep():
    """sweep.py's module: __main__ when the sweep runs as a script (its exception classes are the ones
    run_sample catches), else the imported module."""
    import sys

    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "_flat_out") and hasattr(main, "run_sample"):
        return main
    import sweep

    return sweep


def _inplace_module_class():
    import torch

    class InplaceModule(torch.nn.Module):
        """fn_(intermediate, ...) and fn_(a view of another intermediate, ...)."""

        def __init__(self, fn, spec, slots):
            super().__init__()
            self.fn, self.spec, self.slots = fn, spec, slots

        def forward(self, *xs):
            import torch.utils._pytree as pytree

            def call(target):
                leaves = [xs[v] if k == "i" else v for k, v in self.slots]
                leaves[0] = target
                inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
                self.fn(inp, *args, **kwargs)

            a = xs[0].clone()
            call(a)
            big = torch.stack([xs[0], xs[0]])
            call(big[1])
            return a, big

    return InplaceModule


_INPLACE = None


def _slots(leaves):
    """The module's inputs (each tensor leaf, cloned) and where each leaf comes from: ("i", input index) or ("v", value)."""
    import torch

    inputs, slots = [], []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            slots.append(("i", len(inputs)))
            inputs.append(leaf.detach().clone().contiguous())
        else:
            slots.append(("v", leaf))
    return inputs, slots


def _wrap_inplace(o, s):
    import torch
    import torch.utils._pytree as pytree

    global _INPLACE
    if _INPLACE is None:
        _INPLACE = _inplace_module_class()
    leaves, spec = pytree.tree_flatten((s.input, tuple(s.args), dict(s.kwargs)))
    if not leaves or not isinstance(leaves[0], torch.Tensor):
        raise ValueError("the sample's input is not a tensor")
    inputs, slots = _slots(leaves)
    return _sweep().sample_desc(s), _INPLACE(o.inplace_variant, spec, slots), tuple(inputs)


def select_inplace(wanted=None):
    from torch.testing._internal.common_methods_invocations import op_db

    sw = _sweep()
    EXCLUDED, NONDETERMINISTIC = sw.EXCLUDED, sw.NONDETERMINISTIC
    _sample_dtype, opinfo_key = sw._sample_dtype, sw.opinfo_key

    rows, seen = [], set()
    for o in op_db:
        key = opinfo_key(o)
        if o.inplace_variant is None or EXCLUDED.search(key) or key in seen:
            continue
        if wanted and not {key, f"{key}_", key.split(".")[0]} & set(wanted):
            continue
        seen.add(key)
        inplace_name = getattr(o.inplace_variant, "__name__", "in-place")

        def gen(max_samples, o=o):
            import torch

            if NONDETERMINISTIC.search(opinfo_key(o)):
                return []
            torch.manual_seed(0)
            dt = _sample_dtype(o)
            if dt is None:
                return []
            out = []
            for s in o.sample_inputs("cpu", dt, requires_grad=False):
                if len(out) >= max_samples:
                    break
                try:
                    out.append(_wrap_inplace(o, s))
                except ValueError:
                    continue
            return out

        rows.append((f"{key}_", f"in-place {inplace_name}", gen))
    return rows


def _module_wrapper_class():
    import torch
    import torch.utils._pytree as pytree

    _flat_out = _sweep()._flat_out

    class ModuleCall(torch.nn.Module):
        def __init__(self, m, spec, slots):
            super().__init__()
            self.m, self.spec, self.slots = m, spec, slots

        def forward(self, *xs):
            leaves = [xs[v] if k == "i" else v for k, v in self.slots]
            args, kwargs = pytree.tree_unflatten(leaves, self.spec)
            return _flat_out(self.m(*args, **kwargs))

    return ModuleCall


_MODULE_CALL = None


def _wrap_module(m, args, kwargs, desc):
    import torch
    import torch.utils._pytree as pytree

    global _MODULE_CALL
    if _MODULE_CALL is None:
        _MODULE_CALL = _module_wrapper_class()
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    inputs, slots = _slots(leaves)
    return desc, _MODULE_CALL(m.eval(), spec, slots), tuple(inputs)


def _parametrized_samples():
    """Parametrizations module_db lacks: (key, [(desc, module factory, input shapes)])."""
    import torch.nn as nn
    from torch.nn.utils import parametrizations as P

    return [
        ("parametrizations.weight_norm", [
            ("weight_norm(Linear(6, 5))", lambda: P.weight_norm(nn.Linear(6, 5)), [(3, 6)]),
            ("weight_norm(Conv1d(4, 6, 3), dim=None)", lambda: P.weight_norm(nn.Conv1d(4, 6, 3), dim=None),
             [(2, 4, 9)]),
            ("weight_norm(Conv2d(3, 4, 3), dim=1)", lambda: P.weight_norm(nn.Conv2d(3, 4, 3), dim=1), [(1, 3, 6, 6)]),
        ]),
    ]


def select_modules(wanted=None):
    from torch.testing._internal.common_modules import module_db

    rows, seen = [], set()
    for mi in module_db:
        key = f"nn.{mi.module_cls.__name__}" + (f".{mi.variant_name}" if getattr(mi, "variant_name", "") else "")
        if key in seen or (wanted and key not in wanted):
            continue
        seen.add(key)

        def gen(max_samples, mi=mi):
            import torch

            torch.manual_seed(0)
            dts = mi.dtypes if hasattr(mi, "dtypes") else (torch.float32,)
            if torch.float32 not in set(dts):
                return []
            out = []
            for s in mi.module_inputs_func(mi, device="cpu", dtype=torch.float32, requires_grad=False,
                                           training=False):
                if len(out) >= max_samples:
                    break
                if s.forward_input is None:
                    continue
                ci, fi = s.constructor_input, s.forward_input
                try:
                    m = mi.module_cls(*ci.args, **ci.kwargs)
                except Exception:  # noqa: BLE001 - a constructor sample for other devices/dtypes
                    continue
                cdesc = ", ".join([*(repr(a)[:40] for a in ci.args),
                                   *(f"{k}={v!r}"[:40] for k, v in ci.kwargs.items())])
                _describe = _sweep()._describe
                desc = f"{mi.module_cls.__name__}({cdesc}) forward{_describe(tuple(fi.args))}"
                if fi.kwargs:
                    desc += " kwargs={" + ", ".join(f"{k}={_describe(v)}" for k, v in fi.kwargs.items()) + "}"
                out.append(_wrap_module(m, fi.args, fi.kwargs, desc))
            return out

        rows.append((key, "module_db", gen))
    for key, cases in _parametrized_samples():
        if wanted and key not in wanted:
            continue

        def gen(max_samples, cases=cases):
            import torch

            torch.manual_seed(0)
            return [_wrap_module(make(), [torch.randn(s) for s in shapes], {}, desc)
                    for desc, make, shapes in cases[:max_samples]]

        rows.append((key, "parametrization", gen))
    return rows


def select(category: str, wanted=None):
    if category == "inplace":
        return select_inplace(wanted)
    if category == "modules":
        return select_modules(wanted)
    raise ValueError(category)
