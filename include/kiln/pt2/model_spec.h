// ModelSpec: the model_spec.json the export front end writes beside a .pt2,
// naming the model, its sequence length and the exported program.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace kiln::pt2 {

struct SpecTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string reference;  // absolute path of the reference .npy, if the spec names one
};

// A method that takes nothing and returns constants (ExecuTorch's LLM runner
// reads get_max_seq_len, get_eos_ids, use_kv_cache ... this way).
struct ConstantMethod {
  std::string name;
  std::vector<std::variant<int64_t, double, bool, std::string>> values;  // its outputs, in order
};

struct ModelSpec {
  std::string path;              // the spec file itself
  std::string directory;         // its directory; relative paths resolve against it
  std::string name;              // "gpt2"
  std::string model_id;          // "openai-community/gpt2"
  int64_t seq_len = 0;
  std::string exported_program;  // absolute path of the .pt2
  std::string ir;                // "default" or "core_aten"
  std::vector<SpecTensor> inputs;
  std::vector<SpecTensor> outputs;
  std::vector<ConstantMethod> constant_methods;  // "constant_methods": {name: value or [values]}
};

// Reads and checks `path`; throws kiln::Error naming the file and the field.
ModelSpec read_model_spec(const std::string& path);

}  // namespace kiln::pt2
