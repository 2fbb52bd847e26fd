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
// One pthreadpool, sized by RuntimeOptions::threads, serves XNNPACK and
// kiln's steps.
//
// Per-method options: Program::load_method(name, rt::MethodOptions) hands
// MethodOptions::backend (threads, engine "kiln"|"xnnpack", profiling_detail =
// per_node_subgraphs) to the backend's init in rt::BackendInitContext, and
// kiln::Module fills it from ModuleOptions. Until the backend keeps those in
// its per-delegate State (with the cpu/ thread-pool wrapper), the pool, the
// engine and per-node subgraphs are still process-wide, set here: callers
// (the CLI, kiln::Module) call register_runtime_backend with the same values.
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

struct RuntimeOptions {
  size_t threads = 1;  // 1: no pool, everything on the calling thread
  // One XNNPACK subgraph per node instead of one per run of nodes, so that a
  // profile times each node (XNNPACK's own runtime cannot); programs loaded
  // afterwards run slightly slower.
  bool per_node_subgraphs = false;
  Engine engine = Engine::Kiln;
};

// Registers "XnnpackBackend" with kiln's runtime, or, if it is registered,
// resizes its thread pool. Call before loading programs; false if XNNPACK
// cannot be initialized on this CPU or the registry is full.
bool register_runtime_backend(const RuntimeOptions& options = {});

}  // namespace kiln::backends::xnnpack
