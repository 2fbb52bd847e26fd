"""A fixed subset of the operator coverage sweep (bench/coverage/sweep.py) in CI.

For each operator below, two OpInfo samples (float32) are exported
as one-operator programs and lowered by kiln for both backends. Every sample
kiln lowers must run in ExecuTorch's runtime and in kiln's and match eager
PyTorch (float: 1e-4 * max|ref| + 1e-5, ints/bools exactly). A sample kiln
cannot lower must fail with exactly one `kiln: error:` line and exit code 1
(an operator not supported yet); a crash, a hang or a wrong number fails. The
operators in MUST_LOWER lower today and must keep lowering.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "coverage"))

import sweep  # noqa: E402

# operator -> the OpInfo sample indices it runs (default: the first two). Some pick
# the samples that once found kiln bugs: arange's empty range (a zero-byte constant
# ExecuTorch's runtime rejected), permute's negative dims (a wrong output shape),
# clone's 0-d tensor (an empty IntList kiln's loader rejected).
SAMPLES = {"arange": [0, 2], "permute": [1, 2], "clone": [0, 1],
           # unbatched inputs (sample 1), a padded non-empty input (circular pad sample 2),
           # 1-D operands on either side (matmul), a 0-d input (unfold sample 0, which ExecuTorch's
           # unfold_copy kernel aborts on unless kiln lowers it as a view)
           "nn.functional.conv1d": [0, 1], "nn.functional.pad.circular": [0, 2], "matmul": [1, 2],
           "unfold": [0, 1], "linalg.vector_norm": [0, 2],
           "nn.functional.prelu": [1, 7]}  # a 0-d input with a 1-D weight (sample 7)

# Operators kiln lowers today (every sample, both backends).
MUST_LOWER = [
    "add", "mul", "sub", "div.no_rounding_mode", "maximum", "pow", "cumsum", "softmax", "nn.functional.gelu",
    "nn.functional.silu", "nn.functional.elu", "nn.functional.linear", "nn.functional.layer_norm", "mm", "bmm",
    "select", "split_with_sizes", "constant_pad_nd", "arange", "permute", "clone",
    # lowered since 2026-12-03 (their kernels existed for ExecuTorch's programs): a sample of them
    "acos", "log10", "logical_xor", "reciprocal", "repeat", "slice_scatter", "any", "clamp_min", "var", "index_copy",
    "fill",
    # lowered since 2026-12-03 12:00 UTC (issue 11's gap to ExecuTorch): a sample of them
    "acosh", "atan2", "isnan", "bitwise_xor", "prod", "linalg.vector_norm", "cdist", "nn.functional.pdist",
    "diagonal", "as_strided", "masked_scatter", "index_add", "index_fill", "nn.functional.pad.circular", "matmul",
    "nn.functional.conv1d", "nn.functional.max_pool1d", "nn.functional.interpolate.bicubic",
    "nn.functional.interpolate.linear", "nn.functional.unfold", "grid_sampler_2d", "unfold", "nn.functional.prelu",
]
# Operators issue 11 asks for that may not lower yet: a clean error is allowed,
# a lowering must run correctly.
MAY_LOWER = [
    "nn.functional.conv2d", "nn.functional.scaled_dot_product_attention", "nn.functional.max_pool2d",
    "nn.functional.batch_norm", "topk", "nn.functional.hardswish", "nn.GRU",
]

_OPS = {key: o for key, _, o in sweep.select_ops(MUST_LOWER + MAY_LOWER)}


def _assert_lowers_and_runs_in_both_runtimes(rec):
    """One sweep record: exported, lowered by kiln on both backends, each .pte matching eager in both runtimes."""
    assert rec["export"]["status"] == "ok", rec["export"]
    for backend in sweep.BACKENDS:
        r = rec[f"kiln_{backend}"]
        assert r["lower"]["status"] == "ok", f"{backend}: kiln lower {r['lower']}"
        for runtime in ("et_run", "kiln_run"):
            assert r[runtime]["status"] == "ok", f"{backend} {runtime}: {r[runtime]}"


@pytest.mark.parametrize("op", MUST_LOWER + MAY_LOWER)
def test_samples_lower_cleanly_and_run_correctly_in_both_runtimes(op, kiln_bin, tmp_path):
    assert op in _OPS, f"{op} is not in the sweep's selection"
    wanted = SAMPLES.get(op, [0, 1])
    samples = sweep.samples_of(op, _OPS[op], max(wanted) + 1)
    picked = [i for i in wanted if i < len(samples)]
    assert picked and picked[0] == wanted[0], f"{op}: OpInfo gave {len(samples)} samples"
    for i in picked:
        desc, module, inputs = samples[i]
        rec = sweep.run_sample(kiln_bin, module, inputs, tmp_path, et_lowering=False)
        where = f"{op}[{i}] ({desc})"
        assert rec["export"]["status"] == "ok", f"{where}: torch.export: {rec['export']}"
        for backend in sweep.BACKENDS:
            r = rec[f"kiln_{backend}"]
            lower = r["lower"]
            assert lower["status"] in ("ok", "error"), f"{where} {backend}: kiln lower {lower}"
            if op in MUST_LOWER:
                assert lower["status"] == "ok", f"{where} {backend}: kiln no longer lowers it: {lower['msg']}"
            if lower["status"] == "error":
                continue
            for runtime in ("et_run", "kiln_run"):
                assert r[runtime]["status"] == "ok", f"{where} {backend} {runtime}: {r[runtime]}"


# ---- the decomposition table's operators (non-core: the operator sweep's selection does not hold them), and
# the sweep's in-place and module categories (bench/coverage/categories.py): one sample of each newly lowered
# operator / in-place variant / module; every one must lower on both backends and run correctly in both runtimes.
# nn.BatchNorm1d: the [N, C] batch norm whose output shape kiln once read from a moved value (a 0-d result).
DECOMPOSED = ["baddbmm", "addbmm", "addmv", "addr", "addcmul", "addcdiv", "histc", "stack", "hstack", "vstack",
              "dstack", "mT", "T", "chunk", "unbind", "repeat_interleave", "rsub", "tril", "triu"]
INPLACE = ["add_", "mul_", "div.no_rounding_mode_", "clamp_", "masked_fill_", "index_put_", "sub_", "addcmul_",
           "addcdiv_", "sigmoid_", "tanh_", "conj_physical_", "deg2rad_", "frac_", "floor_divide_",
           "true_divide_",
           # the in-place sweep's functional forms in the decomposition table (2026-12-04)
           "pow_", "rad2deg_", "heaviside_", "sinc_", "sgn_", "nan_to_num_", "nn.functional.threshold_",
           "square_", "lerp_", "xlogy_", "logit_", "renorm_", "nn.functional.feature_alpha_dropout.without_train_",
           "scatter_reduce.sum_", "scatter_reduce.mean_", "exp2_",
           # metadata mutations (the tensor becomes a view of itself) and the dense scatter_reduce (2026-12-05)
           "unsqueeze_", "t_", "as_strided_", "scatter_reduce.prod_", "scatter_reduce.amax_", "scatter_reduce.amin_"]
MODULES = ["nn.Linear", "nn.Conv1d", "nn.LayerNorm", "nn.BatchNorm1d", "nn.MultiheadAttention",
           "nn.TransformerEncoderLayer", "nn.L1Loss", "nn.SmoothL1Loss", "nn.MSELoss", "nn.HuberLoss", "nn.GLU",
           "parametrizations.weight_norm",
           # the losses and shrinks of the decomposition table (2026-12-04)
           "nn.KLDivLoss", "nn.MarginRankingLoss", "nn.SoftMarginLoss", "nn.NLLLoss", "nn.PoissonNLLLoss", "nn.BCELoss",
           "nn.BCEWithLogitsLoss", "nn.CrossEntropyLoss", "nn.MultiMarginLoss", "nn.MultiLabelMarginLoss",
           "nn.Hardshrink", "nn.Softshrink", "nn.Threshold", "nn.HingeEmbeddingLoss", "nn.CosineEmbeddingLoss",
           "nn.RNNCell", "nn.GRUCell", "nn.LSTMCell", "nn.ReflectionPad3d", "nn.ReplicationPad3d",
           # 3-D pooling as two 2-D poolings (2026-12-05)
           "nn.AvgPool3d", "nn.MaxPool3d", "nn.AdaptiveAvgPool3d", "nn.LPPool3d",
           # p = 1.5: pow makes NaNs of negative inputs, which XNNPACK's pooling would clamp (2026-12-05)
           "nn.LPPool1d"]


# the samples some keys run (the rest run their first): tril/triu all (diagonals above and below, non-square,
# batched); the losses each reduction, weights, ignore_index, label smoothing, class probabilities, one sample ([C]).
CATEGORY_SAMPLES = {"tril": list(range(8)), "triu": list(range(8)),
                    "nn.KLDivLoss": [0, 6, 8], "nn.MarginRankingLoss": [0, 3], "nn.NLLLoss": [0, 2, 9, 20, 24],
                    "nn.PoissonNLLLoss": [0, 6], "nn.BCELoss": [0, 4], "nn.BCEWithLogitsLoss": [0, 4],
                    "nn.CrossEntropyLoss": [0, 4, 8, 9, 31, 35], "nn.MultiMarginLoss": [0, 4, 6],
                    "nn.MultiLabelMarginLoss": [1, 6], "nn.HingeEmbeddingLoss": [0, 7], "nn.CosineEmbeddingLoss": [3, 4],
                    "nn.RNNCell": [0, 2], "nn.ReflectionPad3d": [0, 1], "nn.ReplicationPad3d": [0, 1],
                    "pow_": [0, 3], "heaviside_": [1, 3], "logit_": [0, 1],
                    "renorm_": [0, 2], "nn.functional.feature_alpha_dropout.without_train_": [1],
                    "scatter_reduce.sum_": [0, 1, 2], "scatter_reduce.mean_": [0, 1, 2],
                    "scatter_reduce.prod_": [0, 1, 2], "scatter_reduce.amax_": [0, 1, 2], "scatter_reduce.amin_": [0, 1, 2]}


def _category_rows():
    from torch.testing._internal.common_methods_invocations import op_db

    from categories import select

    rows = [(o.name, "decomposed", lambda n, o=o: sweep.samples_of(o.name, o, n))
            for o in op_db if o.name in DECOMPOSED and not o.variant_test_name]
    return rows + select("inplace", INPLACE) + select("modules", MODULES)


@pytest.mark.parametrize("key", DECOMPOSED + INPLACE + MODULES)
def test_category_sample_lowers_and_runs_correctly(key, kiln_bin, tmp_path):
    gens = {k: g for k, _, g in _category_rows()}
    assert key in gens, f"{key} is not in the sweep's selection"
    wanted = CATEGORY_SAMPLES.get(key, [0])
    samples = gens[key](max(wanted) + 1)
    assert len(samples) > max(wanted), f"{key}: {len(samples)} samples, expected {max(wanted) + 1}"
    for i in wanted:
        desc, module, inputs = samples[i]
        rec = sweep.run_sample(kiln_bin, module, inputs, tmp_path, et_lowering=False)
        where = f"{key}[{i}] ({desc})"
        assert rec["export"]["status"] == "ok", f"{where}: torch.export: {rec['export']}"
        for backend in sweep.BACKENDS:
            r = rec[f"kiln_{backend}"]
            assert r["lower"]["status"] == "ok", f"{where} {backend}: kiln lower {r['lower']}"
            for runtime in ("et_run", "kiln_run"):
                assert r[runtime]["status"] == "ok", f"{where} {backend} {runtime}: {r[runtime]}"


# ---- the whole-op_db sweep's decompositions (`sweep.py --all-ops`, 2026-12-05; src/passes/decompositions_opdb.cpp):
# one sample of each op_db entry kiln lowers since (the first, unless OPDB_SAMPLES says), both backends, both
# runtimes, against eager; bucketize and unfold_copy: kiln programs ExecuTorch's runtime once rejected or aborted on.
OPDB = ["positive", "resolve_conj", "resolve_neg", "real", "ravel", "reshape_as", "view_as", "squeeze_copy",
        "atleast_1d", "atleast_2d", "atleast_3d", "t_copy", "narrow", "narrow_copy", "broadcast_to", "fliplr", "flipud",
        "movedim", "rot90", "tile", "hsplit", "vsplit", "dsplit", "nn.functional.channel_shuffle",
        "meshgrid.variadic_tensors", "meshgrid.list_of_tensors", "logsumexp", "std", "std.unbiased", "var_mean",
        "var_mean.unbiased", "std_mean", "std_mean.unbiased", "all", "count_nonzero", "nansum", "nanmean", "trace",
        "dot", "vdot", "linalg.vecdot", "inner", "mv", "outer", "cross", "linalg.cross", "take", "take_along_dim",
        "logaddexp", "logaddexp2", "round.decimals_3", "round.decimals_neg_3", "erfc", "special.ndtr", "hypot",
        "signbit", "copysign", "fmax", "fmin", "isfinite", "isposinf", "isneginf", "isreal", "special.xlog1py",
        "special.entr", "isclose", "eye", "masked.var", "masked.std", "masked.normalize", "mH", "H",
        "sum_to_size", "aminmax", "nn.functional.pairwise_distance", "nn.functional.triplet_margin_loss",
        "nn.functional.triplet_margin_with_distance_loss", "nn.functional.cosine_similarity", "isin", "linspace",
        "linspace.tensor_overload", "logspace", "logspace.tensor_overload", "column_stack", "block_diag",
        "cartesian_prod", "diag_embed", "diag", "diagflat", "nn.functional.max_unpool1d", "nn.functional.max_unpool2d",
        "nn.functional.max_unpool3d", "bucketize", "unfold_copy", "kron", "tensordot", "trapz", "trapezoid",
        "cumulative_trapezoid", "nn.functional.grid_sample",
        # a 0-d input and target (one sample of one class)
        "nn.functional.multi_margin_loss", "nn.functional.multilabel_margin_loss",
        # n = 0 (the input itself, prepend/append ignored) and n = 3 with prepend/append
        "diff", "_unsafe_masked_index", "_unsafe_masked_index_put_accumulate", "argsort", "msort",
        "gradient", "fft.fftshift", "fft.ifftshift", "linalg.multi_dot", "linalg.matrix_power", "linalg.norm",
        "linalg.matrix_norm",
        # ord -0.5 of a vector with zeros: XNNPACK's reciprocal square root made NaN of 0 in ExecuTorch's runtime
        "linalg.norm.subgradients_at_zero", "float_power",
        # p = inf (sample 3): the largest |x| of each slice, once a wrong number
        "renorm"]
# std/var_mean/std_mean: a dim (sample 1) and keepdim (2) too; linspace/logspace: steps 0 (sample 0) and more;
# tensordot: contracted dims of sizes 1 and 2 (sample 2); trapz/cumulative_trapezoid: a spacing dx (sample 3).
OPDB_SAMPLES = {"std": [0, 1, 2], "var_mean": [0, 1, 2], "std_mean": [0, 1, 2], "linspace": [0, 3],
                "logspace": [0, 3], "linspace.tensor_overload": [0, 3], "logspace.tensor_overload": [0, 3],
                "bucketize": [0, 2], "tensordot": [0, 2], "trapz": [0, 3], "cumulative_trapezoid": [0, 3],
                "diff": [0, 22, 25], "gradient": [0, 1],
                "linalg.matrix_power": [0, 7], "linalg.matrix_norm": [0, 3],
                "linalg.norm.subgradients_at_zero": [7], "float_power": [0, 4], "renorm": [0, 3]}
_OPDB = {key: o for key, _, o in sweep.select_ops(OPDB, "all")}


@pytest.mark.parametrize("key", OPDB)
def test_opdb_decomposition_sample_lowers_and_runs_correctly(key, kiln_bin, tmp_path):
    assert key in _OPDB, f"{key} is not in op_db"
    wanted = OPDB_SAMPLES.get(key, [0])
    samples = sweep.samples_of(key, _OPDB[key], max(wanted) + 1)
    assert len(samples) > max(wanted), f"{key}: {len(samples)} samples, expected {max(wanted) + 1}"
    for i in wanted:
        desc, module, inputs = samples[i]
        rec = sweep.run_sample(kiln_bin, module, inputs, tmp_path, et_lowering=False)
        where = f"{key}[{i}] ({desc})"
        assert rec["export"]["status"] == "ok", f"{where}: torch.export: {rec['export']}"
        for backend in sweep.BACKENDS:
            r = rec[f"kiln_{backend}"]
            assert r["lower"]["status"] == "ok", f"{where} {backend}: kiln lower {r['lower']}"
            for runtime in ("et_run", "kiln_run"):
                assert r[runtime]["status"] == "ok", f"{where} {backend} {runtime}: {r[runtime]}"


class _FloatPowers(__import__("torch").nn.Module):
    """float_power's number overloads (op_db's samples are tensor ** tensor): float64 results."""

    def forward(self, x):
        import torch
        return torch.float_power(x, 2.5), torch.float_power(1.5, x)


def test_float_power_number_operands_match_eager(kiln_bin, tmp_path):
    import torch
    torch.manual_seed(0)
    rec = sweep.run_sample(kiln_bin, _FloatPowers(), (torch.rand(3, 4) + 0.5,), tmp_path, et_lowering=False)
    _assert_lowers_and_runs_in_both_runtimes(rec)


class _Cells(__import__("torch").nn.Module):
    """The RNN cells batched and without biases (module_db's samples are unbatched, with biases)."""

    def __init__(self):
        import torch
        super().__init__()
        self.rnn = torch.nn.RNNCell(5, 6, bias=False, nonlinearity="relu")
        self.gru = torch.nn.GRUCell(5, 6, bias=False)
        self.lstm = torch.nn.LSTMCell(5, 6)

    def forward(self, x, h, c):
        hl, cl = self.lstm(x, (h, c))
        return self.rnn(x, h), self.gru(x, h), hl, cl


def test_batched_rnn_cells_without_biases_match_eager(kiln_bin, tmp_path):
    import torch
    torch.manual_seed(0)
    inputs = (torch.randn(3, 5), torch.randn(3, 6), torch.randn(3, 6))
    rec = sweep.run_sample(kiln_bin, _Cells().eval(), inputs, tmp_path, et_lowering=False)
    _assert_lowers_and_runs_in_both_runtimes(rec)




class _NanPools(__import__("torch").nn.Module):
    """Poolings of operators that make NaNs of finite inputs (negative ones): eager's pooling keeps a NaN,
    XNNPACK's clamps it to -inf (average) or skips it (max), so kiln keeps these poolings off the delegate.
    `max_nan`: also a max pooling of such NaNs, which ExecuTorch's portable max_pool2d_with_indices kernel
    skips as XNNPACK's does (its runtime gets ExecuTorch's own program of it wrong too): checked in kiln's
    runtime only."""

    def __init__(self, max_nan=False):
        super().__init__()
        self.max_nan = max_nan

    def forward(self, x):
        import torch
        f = torch.nn.functional
        if self.max_nan:
            return (f.max_pool2d(torch.sqrt(x), 2),)
        return (f.avg_pool2d(x.pow(2.5), 2), f.avg_pool1d(torch.log(x[0]), 3),
                f.avg_pool2d(torch.pow(x, torch.full_like(x, 1.5)), 3),
                f.max_pool2d(x.pow(2), 2))  # the last: no NaN source, delegated as before


@pytest.mark.parametrize("max_nan", [False, True])
def test_poolings_of_nan_making_operators_keep_eagers_nans(kiln_bin, tmp_path, max_nan):
    import torch
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6)
    x[0, 0, 0, 0] = -1.0  # at least one NaN in a window of each pooling
    rec = sweep.run_sample(kiln_bin, _NanPools(max_nan).eval(), (x,), tmp_path, et_lowering=False)
    assert rec["export"]["status"] == "ok", rec["export"]
    for backend in sweep.BACKENDS:
        r = rec[f"kiln_{backend}"]
        assert r["lower"]["status"] == "ok", f"{backend}: kiln lower {r['lower']}"
        for runtime in ("kiln_run",) if max_nan else ("et_run", "kiln_run"):
            assert r[runtime]["status"] == "ok", f"{backend} {runtime}: {r[runtime]}"


class _ReductionsOf0d(__import__("torch").nn.Module):
    """Reductions over dim 0 of 0-d tensors (torch takes dim 0 or -1 there). ExecuTorch's sum and cumsum kernels
    abort its runtime on them (its own programs of these too), and the core-ATen forms of logsumexp and nansum
    write such a sum; kiln's var/std once failed on them with an internal error."""

    def forward(self, x, i, b):
        import torch
        return (torch.sum(x, 0), torch.sum(x, [0], keepdim=True), torch.cumsum(x, -1), torch.mean(x, 0),
                torch.logsumexp(x, 0), torch.nansum(x, 0), torch.var(x, 0, correction=0), torch.std(x, 0),
                torch.var_mean(x, 0, correction=0)[1], torch.amax(x, 0),
                torch.sum(i, 0), torch.cumsum(i, 0), torch.sum(b, 0))  # int32 and bool sums are int64


@pytest.mark.parametrize("decompose", [False, True], ids=["default_ir", "core_aten"])
def test_reductions_of_0d_tensors_match_eager_in_both_runtimes(kiln_bin, tmp_path, decompose):
    import torch
    inputs = (torch.tensor(0.7), torch.tensor(5, dtype=torch.int32), torch.tensor(True))
    rec = sweep.run_sample(kiln_bin, _ReductionsOf0d().eval(), inputs, tmp_path, et_lowering=False,
                           decompose=decompose)
    _assert_lowers_and_runs_in_both_runtimes(rec)


class _NarrowCopy(__import__("torch").nn.Module):
    def forward(self, x):
        import torch
        return torch.narrow_copy(x, 1, 1, 3), torch.narrow_copy(x, 2, 2, 2)  # (ExecuTorch's kernel takes neither dim -1 nor start -2)


def test_executorchs_program_of_narrow_copy_runs_in_kilns_runtime(kiln_bin, tmp_path):
    """ExecuTorch's lowering keeps narrow_copy as aten::narrow_copy.out (kiln's writes a slice): kiln's runtime
    runs that kernel and matches eager."""
    import torch
    torch.manual_seed(0)
    rec = sweep.run_sample(kiln_bin, _NarrowCopy().eval(), (torch.randn(3, 5, 4),), tmp_path, et_lowering=True)
    assert rec["export"]["status"] == "ok", rec["export"]
    for backend in sweep.BACKENDS:
        r = rec[f"et_{backend}"]
        assert r["lower"]["status"] == "ok", f"{backend}: ExecuTorch's lowering {r['lower']}"
        assert r["kiln_run"]["status"] == "ok", f"{backend}: kiln's runtime on ExecuTorch's program {r['kiln_run']}"
        assert r["et_run"]["status"] == "ok", f"{backend}: ExecuTorch's runtime {r['et_run']}"


class _MovedimInt(__import__("torch").nn.Module):
    def forward(self, x, s):
        import torch
        return torch.movedim(x, 0, -1), torch.movedim(x, -1, 1), torch.movedim(s, 0, 0) * 2


def test_movedim_with_int_dims_matches_eager_in_both_runtimes(kiln_bin, tmp_path):
    """aten.movedim.int (the default IR keeps it when both dims are ints), of a 3-D and of a 0-d tensor."""
    import torch
    torch.manual_seed(0)
    rec = sweep.run_sample(kiln_bin, _MovedimInt().eval(), (torch.randn(2, 3, 4), torch.tensor(0.5)), tmp_path,
                           et_lowering=False)
    _assert_lowers_and_runs_in_both_runtimes(rec)


class _SumToSizeInts(__import__("torch").nn.Module):
    def forward(self, i, b, m):
        return i.sum_to_size(()), b.sum_to_size(()), m.sum_to_size((2, 3)), m.sum_to_size((1, 3))


def test_sum_to_size_of_ints_keeps_eagers_dtype_in_both_runtimes(kiln_bin, tmp_path):
    """sum_to_size of int32 and bool tensors (the sweep's --dtypes found it): eager sums a 0-d tensor to () into
    int64, keeps an unchanged [2, 3] int32, and sums to [1, 3] into int64; kiln once kept int32/bool for the 0-d."""
    import torch
    inputs = (torch.tensor(5, dtype=torch.int32), torch.tensor(True), torch.arange(6, dtype=torch.int32).reshape(2, 3))
    rec = sweep.run_sample(kiln_bin, _SumToSizeInts().eval(), inputs, tmp_path, et_lowering=False)
    _assert_lowers_and_runs_in_both_runtimes(rec)


# The float16 / bfloat16 sweep (`--dtypes float16,bfloat16`, COVERAGE.md "Other dtypes"): one sample of each dtype
# of the entries kiln refused or got wrong there, since fixed (16-bit signatures on XNNPACK, float32-only kernels
# and rewrites); ExecuTorch's lowering beside it where its float16 XNNPACK payloads are the point.
SIXTEEN_BIT = ["abs", "addmm", "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.group_norm",
               "nn.functional.interpolate.bilinear", "nn.functional.logsigmoid", "nn.functional.mish", "var",
               "nn.functional.rms_norm", "nn.functional.grid_sample", "nan_to_num", "linspace", "logspace", "eye",
               "half", "nn.functional.triplet_margin_loss", "nn.functional.interpolate.linear",
               "nn.functional.interpolate.bicubic", "nn.functional.interpolate.trilinear",
               "nn.functional.scaled_dot_product_attention", "scatter_reduce.mean", "sort", "argsort",
               "nn.functional.conv_transpose2d"]
_SIXTEEN = {key: o for key, _, o in sweep.select_ops(SIXTEEN_BIT, "all")}


@pytest.mark.parametrize("key", SIXTEEN_BIT)
def test_16_bit_sample_lowers_and_runs_correctly(key, kiln_bin, tmp_path):
    assert key in _SIXTEEN, f"{key} is not in op_db"
    samples = sweep.samples_of(key, _SIXTEEN[key], 1, ["float16", "bfloat16"])
    assert samples, f"{key}: no float16 / bfloat16 sample"
    for desc, module, inputs in samples:
        rec = sweep.run_sample(kiln_bin, module, inputs, tmp_path, et_lowering=key in ("abs", "addmm"),
                               ties=sweep.ties_unspecified(key, desc))
        assert rec["export"]["status"] == "ok", f"{key} ({desc}): torch.export: {rec['export']}"
        for backend in sweep.BACKENDS:
            for producer in ("kiln", "et") if key in ("abs", "addmm") else ("kiln",):
                r = rec[f"{producer}_{backend}"]
                assert r["lower"]["status"] == "ok", f"{key} ({desc}) {producer} {backend}: lower {r['lower']}"
                for runtime in ("et_run", "kiln_run"):
                    assert r[runtime]["status"] == "ok", f"{key} ({desc}) {producer} {backend} {runtime}: {r[runtime]}"


def test_sort_and_topk_orders_compare_equal_only_up_to_ties():
    """The sweep's comparison of sort orders (`ties`): an order that differs from eager's only among equal values
    passes; one that swaps unequal values, repeats an index, or is not a permutation fails; a stable sort's order
    is compared exactly."""
    import numpy as np

    x = np.array([[3.0, 1.0, 3.0, 2.0], [0.5, 0.5, 0.5, -1.0]], dtype=np.float32)
    eager = np.argsort(x, axis=1, kind="stable")                       # [[1, 3, 0, 2], [3, 0, 1, 2]]
    ties = np.array([[1, 3, 2, 0], [3, 2, 0, 1]])                      # equal values in another order
    swapped = np.array([[3, 1, 0, 2], [3, 0, 1, 2]])                   # 2.0 before 1.0
    repeated = np.array([[1, 3, 0, 0], [3, 0, 1, 2]])
    assert sweep.compare([ties], [eager], tie_sources=[x]) is None
    assert sweep.compare([ties], [eager]) is not None                   # no ties allowed: exact
    for bad in (swapped, repeated):
        assert sweep.compare([bad], [eager], tie_sources=[x]) is not None
    assert sweep.ties_unspecified("sort", "input=float16[8000]")
    assert not sweep.ties_unspecified("sort", "input=float16[8000] kwargs={stable=True}")
    assert sweep.ties_unspecified("topk", "input=int64[5, 10, 5] args=(3)")
    assert not sweep.ties_unspecified("max_pool2d", "input=int64[1, 2, 3, 6]")
    # top-k: 2 of each row, ties among the 3.0s in another order, a repeated index, a smaller value
    top = np.array([[0, 2], [0, 1]])
    assert sweep.compare([np.array([[2, 0], [1, 2]])], [top], tie_sources=[x]) is None
    assert sweep.compare([np.array([[0, 0], [0, 1]])], [top], tie_sources=[x]) is not None
    assert sweep.compare([np.array([[0, 3], [0, 1]])], [top], tie_sources=[x]) is not None


# The int64 / int32 / bool sweep (`--dtypes int64,int32,bool`, COVERAGE.md "Other dtypes"): one sample of each dtype
# of the entries kiln got wrong or could not run there, since fixed (integer pooling, convolution and pads in kiln's
# kernels, bool scatters and sorts, integer hardtanh / linspace / logspace / scatter_reduce mean, max_pool3d's
# ties). INT_ET: where ExecuTorch's own program is the point (kiln's runtime once refused it).
INT_SAMPLES = ["nn.functional.avg_pool1d", "nn.functional.avg_pool3d", "nn.functional.local_response_norm",
               "nn.functional.conv1d", "nn.functional.conv_transpose2d", "nn.functional.pad.reflect",
               "nn.functional.pad.replicate_negative", "nn.functional.max_pool2d", "nn.functional.max_pool3d", "topk",
               "nn.functional.hardtanh", "nn.functional.relu6", "sort", "argsort", "scatter_add", "scatter_reduce.prod",
               "scatter_reduce.amax", "scatter_reduce.mean", "nn.functional.poisson_nll_loss", "linspace", "logspace",
               "clamp_max", "remainder", "__rmod__"]
INT_ET = ("nn.functional.avg_pool2d", "nn.functional.hardtanh", "clamp_max", "scatter_add")
_INTS = {key: o for key, _, o in sweep.select_ops(INT_SAMPLES + list(INT_ET), "all")}


@pytest.mark.parametrize("key", sorted(set(INT_SAMPLES) | set(INT_ET)))
def test_integer_and_bool_samples_lower_and_run_correctly(key, kiln_bin, tmp_path):
    assert key in _INTS, f"{key} is not in op_db"
    samples = sweep.samples_of(key, _INTS[key], 1, ["int64", "int32", "bool"])
    assert samples, f"{key}: no int64 / int32 / bool sample"
    for desc, module, inputs in samples:
        rec = sweep.run_sample(kiln_bin, module, inputs, tmp_path, et_lowering=key in INT_ET,
                               ties=sweep.ties_unspecified(key, desc))
        assert rec["export"]["status"] == "ok", f"{key} ({desc}): torch.export: {rec['export']}"
        for backend in sweep.BACKENDS:
            if key in INT_SAMPLES:
                r = rec[f"kiln_{backend}"]
                assert r["lower"]["status"] == "ok", f"{key} ({desc}) {backend}: lower {r['lower']}"
                for runtime in ("et_run", "kiln_run"):
                    assert r[runtime]["status"] == "ok", f"{key} ({desc}) kiln {backend} {runtime}: {r[runtime]}"
            if key in INT_ET:
                r = rec[f"et_{backend}"]
                if r["lower"]["status"] == "ok" and r["et_run"]["status"] == "ok":
                    assert r["kiln_run"]["status"] == "ok", f"{key} ({desc}) ET's {backend} file in kiln: {r['kiln_run']}"


def _assert_kiln_samples_correct(kiln_bin, key, samples, tmp_path, runtimes=("et_run", "kiln_run")):
    """Each sample exported, lowered by kiln on both backends, and correct against eager in each of `runtimes`."""
    for desc, module, inputs in samples:
        rec = sweep.run_sample(kiln_bin, module, inputs, tmp_path, et_lowering=False)
        assert rec["export"]["status"] == "ok", f"{key} ({desc}): torch.export: {rec['export']}"
        for backend in sweep.BACKENDS:
            r = rec[f"kiln_{backend}"]
            assert r["lower"]["status"] == "ok", f"{key} ({desc}) {backend}: lower {r['lower']}"
            for runtime in runtimes:
                assert r[runtime]["status"] == "ok", f"{key} ({desc}) kiln {backend} {runtime}: {r[runtime]}"


# The uint8 / int8 / int16 sweep (`--dtypes uint8,int8,int16`): the entries kiln got wrong (a step computed in
# float where eager wraps in uint8: margin ranking, distances, trapezoids) or refused (eye, scatter_reduce
# prod/amin/amax of narrow integers), since fixed. One sample of each of the three dtypes, both backends, both runtimes.
NARROW_INT_SAMPLES = ["nn.functional.margin_ranking_loss", "nn.functional.triplet_margin_with_distance_loss",
                      "nn.functional.pairwise_distance", "trapz", "trapezoid", "cumulative_trapezoid", "eye",
                      "scatter_reduce.prod", "scatter_reduce.amin", "scatter_reduce.amax"]
_NARROW = {key: o for key, _, o in sweep.select_ops(NARROW_INT_SAMPLES, "all")}


@pytest.mark.parametrize("key", NARROW_INT_SAMPLES)
def test_narrow_integer_samples_wrap_as_eager_in_both_runtimes(key, kiln_bin, tmp_path):
    assert key in _NARROW, f"{key} is not in op_db"
    samples = sweep.samples_of(key, _NARROW[key], 1, ["uint8", "int8", "int16"])
    assert len(samples) >= 2, f"{key}: fewer than two uint8 / int8 / int16 samples"
    _assert_kiln_samples_correct(kiln_bin, key, samples, tmp_path)


# The float64 sweep (`--dtypes float64`): kiln's own kernels that took float32 only (pooling, convolution, group
# norm, bilinear upsampling, grid sampling) and rewrites that refused float64 (activations, rms_norm, var, std,
# nan_to_num, linspace / logspace, scatter_reduce mean), since fixed: one float64 sample each, both backends, both runtimes.
# ExecuTorch's portable library has no 3-D convolution: its runtime cannot run those programs (nor its own).
FLOAT64_SAMPLES = ["nn.functional.avg_pool2d", "nn.functional.max_pool2d", "nn.functional.adaptive_avg_pool2d",
                   "nn.functional.adaptive_max_pool3d", "nn.functional.local_response_norm", "nn.functional.conv2d",
                   "nn.functional.conv_transpose1d", "nn.functional.conv3d", "nn.functional.group_norm",
                   "nn.functional.instance_norm", "nn.functional.upsample_bilinear",
                   "nn.functional.mish", "nn.functional.hardswish",
                   "nn.functional.logsigmoid", "nn.functional.rms_norm", "nan_to_num", "linspace", "logspace",
                   "nn.functional.grid_sample", "var", "std", "scatter_reduce.mean"]
FLOAT64_NOT_IN_ET = {"nn.functional.conv3d"}
_F64 = {key: o for key, _, o in sweep.select_ops(FLOAT64_SAMPLES, "all")}


@pytest.mark.parametrize("key", FLOAT64_SAMPLES)
def test_float64_samples_lower_and_run_correctly(key, kiln_bin, tmp_path):
    assert key in _F64, f"{key} is not in op_db"
    samples = sweep.samples_of(key, _F64[key], 1, ["float64"])
    assert samples, f"{key}: no float64 sample"
    _assert_kiln_samples_correct(kiln_bin, key, samples, tmp_path,
                                 ("kiln_run",) if key in FLOAT64_NOT_IN_ET else ("et_run", "kiln_run"))


class _IntPools3d(__import__("torch").nn.Module):
    def forward(self, x):
        import torch.nn.functional as F

        v, i = F.max_pool3d(x, 2, stride=1, padding=1, return_indices=True)
        return (F.avg_pool3d(x, (2, 3, 2), stride=(1, 2, 1), padding=1, count_include_pad=False, ceil_mode=True),
                F.avg_pool3d(x, 3, stride=2, padding=1), F.avg_pool3d(x, 2, divisor_override=3), v, i)


def test_integer_3d_pooling_matches_eager_in_both_runtimes(kiln_bin, tmp_path):
    """3-D pooling of int64 values with many ties: averages divided once and truncated as eager's (padding, with
    and without count_include_pad, ceil mode, a divisor override), and max pooling's indices picking the first
    maximum in eager's scan order (depth, row, column)."""
    import torch

    torch.manual_seed(0)
    x = torch.randint(-4, 5, (2, 3, 4, 5, 6), dtype=torch.int64)
    rec = sweep.run_sample(kiln_bin, _IntPools3d().eval(), (x,), tmp_path, et_lowering=False)
    _assert_lowers_and_runs_in_both_runtimes(rec)


class _Remainders(__import__("torch").nn.Module):
    def forward(self, a, b, f):
        import torch

        return a % b, a % -3, torch.remainder(7, b), b.int() % 5, f % -1.5


def test_remainder_takes_the_divisors_sign_in_both_runtimes(kiln_bin, tmp_path):
    """remainder of every sign combination (int64 and int32 tensors, scalar divisors and dividends, float32):
    Python's sign rule in both runtimes, whose integer remainder kernel ExecuTorch writes as C's (-8 % 6: -2)."""
    import torch

    a = torch.tensor([-8, 8, -7, 7, -8, 0, 9, -9])
    b = torch.tensor([6, -6, -3, 3, -6, 5, -4, 4])
    rec = sweep.run_sample(kiln_bin, _Remainders().eval(), (a, b, torch.linspace(-4, 4, 8)), tmp_path,
                           et_lowering=False)
    _assert_lowers_and_runs_in_both_runtimes(rec)


class _NearestInt(__import__("torch").nn.Module):
    def forward(self, x):
        import torch.nn.functional as F

        return F.interpolate(x, size=(5, 7), mode="nearest"), F.interpolate(x, scale_factor=2.0, mode="nearest")


class _BilinearInt(__import__("torch").nn.Module):
    def forward(self, x):
        import torch.nn.functional as F

        return F.interpolate(x, size=(5, 7), mode="bilinear")


def test_integer_nearest_resize_runs_and_integer_bilinear_is_refused(kiln_bin, tmp_path):
    """Nearest 2-D resizing of uint8 tensors (a copy; eager's only integer type there) matches eager in both
    runtimes; bilinear resizing of them
    (eager's uint8 kernel rounds fixed-point weights between passes, which no kernel here reproduces) is refused
    with its reason, never written as a wrong program."""
    import torch

    torch.manual_seed(0)
    x = torch.randint(0, 200, (1, 2, 3, 4), dtype=torch.uint8)
    (tmp_path / "nearest").mkdir()
    (tmp_path / "bilinear").mkdir()
    rec = sweep.run_sample(kiln_bin, _NearestInt().eval(), (x,), tmp_path / "nearest", et_lowering=False)
    _assert_lowers_and_runs_in_both_runtimes(rec)
    rec = sweep.run_sample(kiln_bin, _BilinearInt().eval(), (x,), tmp_path / "bilinear", et_lowering=False)
    for backend in sweep.BACKENDS:
        r = rec[f"kiln_{backend}"]["lower"]
        assert r["status"] == "error" and "bilinear resizing of an integer tensor" in r["msg"], r
