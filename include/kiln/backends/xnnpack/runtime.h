// The XNNPACK backend of kiln's runtime: runs the "XnnpackBackend" delegate
// payloads of a .pte (kiln's and ExecuTorch's: XNNHeader + XNNGraph
// flatbuffer, constants from the payload or the program's named data).
//
// At init the backend parses the graph, defines every run of nodes that
// Debian's XNNPACK library implements as one XNNPACK subgraph (weights packed
// once, there), and puts the nodes that library lacks (batch matmul,
// transpose, slice, concatenate, tanh, gelu, rsqrt, exp, log, sin, cos, copy)
// on kiln's own code in between. Every intermediate value lives in one arena
// planned by lifetime; reshapes are views of their input. execute() binds the
// call's tensors and runs the steps; it allocates nothing.
//
// One pthreadpool, sized by RuntimeOptions::threads, serves XNNPACK and
// kiln's steps.
#pragma once

#include <cstddef>

namespace kiln::backends::xnnpack {

// Who runs fully-connected nodes: kiln (its GEMM for many rows, a streaming
// GEMV for a few; [K, N] weights read in place where the file maps them), or
// Debian's XNNPACK (2022), which packs them at load. kiln's is the default:
// on this project's AVX-512 machine it is faster at seq_len 128 and at 1, and
// loads in milliseconds (bench/RESULTS.md has both).
enum class FullyConnected { Kiln, Xnnpack };

struct RuntimeOptions {
  size_t threads = 1;  // 1: no pool, everything on the calling thread
  // One XNNPACK subgraph per node instead of one per run of nodes, so that a
  // profile times each node (XNNPACK's own runtime cannot); programs loaded
  // afterwards run slightly slower.
  bool per_node_subgraphs = false;
  FullyConnected fully_connected = FullyConnected::Kiln;
};

// Registers "XnnpackBackend" with kiln's runtime, or, if it is registered,
// resizes its thread pool. Call before loading programs; false if XNNPACK
// cannot be initialized on this CPU or the registry is full.
bool register_runtime_backend(const RuntimeOptions& options = {});

}  // namespace kiln::backends::xnnpack
