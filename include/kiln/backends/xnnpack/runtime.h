// The XNNPACK backend of kiln's runtime: runs the "XnnpackBackend" delegate
// payloads of a .pte (kiln's and ExecuTorch's: XNNHeader + XNNGraph
// flatbuffer, constants from the payload or the program's named data).
//
// At init the backend parses and checks the graph and turns its nodes into
// steps: XNNPACK subgraphs (Debian's libxnnpack) for runs of nodes the engine
// gives the library, kiln's own code for the rest -- always for the nodes that
// library lacks (batch matmul, transpose, slice, concatenate, tanh, gelu,
// rsqrt, exp, log, sin, cos, copy), and with the default engine also for
// fully-connected nodes and fused elementwise row chains (see Engine). Every
// intermediate value lives in one arena planned by lifetime; reshapes are
// views of their input. execute() binds the call's tensors and runs the
// steps; it allocates nothing.
//
// Options are per method, not per process: Program::load_method(name,
// rt::MethodOptions) hands MethodOptions::backend to the backend's init
// (rt::BackendInitContext): `threads` sizes the pool the delegate's steps and
// XNNPACK runtimes run on (delegates asking for the same size share one
// pool), `engine` picks who runs the nodes both can run ("kiln", the default,
// or "xnnpack"; anything else is an error at load), and `profiling_detail`
// builds one XNNPACK subgraph per node so a profile times each node.
// kiln::Module fills them from ModuleOptions.
#pragma once

#include <cstddef>

namespace kiln::backends::xnnpack {

// Who runs the nodes both can run.
//  Kiln (default): fully-connected nodes on kiln's GEMM (many rows) or a
//    streaming GEMV (a few rows), reading [K, N] weights where the file maps
//    them; chains of elementwise nodes, softmax and row means fused into one
//    pass per row; XNNPACK runs the nodes kiln has no code for (convolution,
//    pooling, padding, ...). Faster here at seq_len 128 and 1, loads in ms.
//  Xnnpack: every node Debian's XNNPACK (2022) implements runs on it (weights
//    packed at load); kiln's code runs only the nodes that library lacks.
// bench/RESULTS.md measures both.
enum class Engine { Kiln, Xnnpack };

// Registers "XnnpackBackend" with kiln's runtime (idempotent). Call before
// loading programs; false if XNNPACK cannot be initialized on this CPU or the
// backend registry is full.
bool register_runtime_backend();

}  // namespace kiln::backends::xnnpack
