// `kiln inspect FILE.pte`: what a .pte program holds — per plan its
// instructions by operator and backend, values by kind, inputs and outputs,
// planned memory; then constants, segments, delegates and named data.
// Reads the file through kiln's verified loader (kiln/runtime/pte_file.h).
#include "commands.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/fb/kiln_program_generated.h"
#include "kiln/runtime/pte_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace kiln::cli {
namespace {

using nlohmann::json;

std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

std::string dtype_text(fb::ScalarType t) {
  auto name = dtype_name(static_cast<ScalarType>(t));
  if (name == "unknown") return fmt::format("dtype{}", static_cast<int>(t));
  return std::string(name);
}

struct Io {
  int32_t index = 0;
  std::string kind;
  std::string dtype;              // tensors only
  std::vector<int64_t> shape;     // tensors only
};

struct PlanSummary {
  std::string name;
  size_t instructions = 0;
  std::map<std::string, int64_t> kernel_calls, delegate_calls, other_instructions, values;
  std::vector<Io> inputs, outputs;
  std::vector<int64_t> buffer_sizes;
  size_t value_count = 0;
};

Io describe_value(const fb::ExecutionPlan& plan, int32_t index) {
  Io io;
  io.index = index;
  const fb::EValue* v = plan.values()->Get(static_cast<uint32_t>(index));
  io.kind = fb::EnumNameKernelTypes(v->val_type());
  if (const fb::Tensor* t = v->val_as_Tensor()) {
    io.dtype = dtype_text(t->scalar_type());
    for (int32_t s : *t->sizes()) io.shape.push_back(s);
  }
  return io;
}

PlanSummary summarize(const fb::ExecutionPlan& plan) {
  PlanSummary s;
  s.name = str(plan.name());
  s.value_count = plan.values()->size();
  for (const fb::EValue* v : *plan.values()) ++s.values[fb::EnumNameKernelTypes(v->val_type())];
  if (plan.chains()) {
    for (const fb::Chain* chain : *plan.chains()) {
      if (!chain->instructions()) continue;
      for (const fb::Instruction* ins : *chain->instructions()) {
        ++s.instructions;
        if (const auto* k = ins->instr_args_as_KernelCall()) {
          const fb::Operator* op = plan.operators()->Get(static_cast<uint32_t>(k->op_index()));
          std::string name = str(op->name()), overload = str(op->overload());
          ++s.kernel_calls[overload.empty() ? name : name + "." + overload];
        } else if (const auto* d = ins->instr_args_as_DelegateCall()) {
          ++s.delegate_calls[str(plan.delegates()->Get(static_cast<uint32_t>(d->delegate_index()))->id())];
        } else {
          ++s.other_instructions[fb::EnumNameInstructionArguments(ins->instr_args_type())];
        }
      }
    }
  }
  for (int32_t i : *plan.inputs()) s.inputs.push_back(describe_value(plan, i));
  for (int32_t i : *plan.outputs()) s.outputs.push_back(describe_value(plan, i));
  for (int64_t b : *plan.non_const_buffer_sizes()) s.buffer_sizes.push_back(b);
  return s;
}

json io_json(const Io& io) {
  json j = {{"index", io.index}, {"kind", io.kind}};
  if (io.kind == "Tensor") {
    j["dtype"] = io.dtype;
    j["shape"] = io.shape;
  }
  return j;
}

std::string io_text(const Io& io) {
  if (io.kind != "Tensor") return fmt::format("value {:<6} {}", io.index, io.kind);
  return fmt::format("value {:<6} {}[{}]", io.index, io.dtype, fmt::join(io.shape, ", "));
}

// Histogram entries, most frequent first.
std::vector<std::pair<std::string, int64_t>> by_count(const std::map<std::string, int64_t>& m) {
  std::vector<std::pair<std::string, int64_t>> v(m.begin(), m.end());
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return v;
}

}  // namespace

int inspect_pte(const std::string& path, bool as_json) {
  rt::ErrorMessage error;
  rt::Result<rt::PteFile> loaded = rt::PteFile::open(path.c_str(), &error);
  if (!loaded.ok()) fail("{}: {}", path, error.empty() ? rt::status_name(loaded.status()) : error.c_str());
  const rt::PteFile& file = loaded.value();
  const fb::Program& program = file.program();

  std::vector<PlanSummary> plans;
  for (const fb::ExecutionPlan* plan : *program.execution_plan()) plans.push_back(summarize(*plan));

  // Constants: slot 0 is the reserved "not a constant" entry.
  const size_t constant_count = file.constant_count() > 0 ? file.constant_count() - 1 : 0;
  uint64_t constant_bytes = 0;
  for (size_t i = 1; i < file.constant_count(); ++i) constant_bytes += file.constant(i).value().size();
  const bool constants_inline = program.constant_buffer() && program.constant_buffer()->size() > 0;

  struct Delegate {
    size_t plan, index;
    std::string backend, location;
    uint32_t location_index;
    uint64_t size;
    std::vector<std::string> compile_specs;
  };
  std::vector<Delegate> delegates;
  for (size_t p = 0; p < program.execution_plan()->size(); ++p) {
    const fb::ExecutionPlan* plan = program.execution_plan()->Get(static_cast<uint32_t>(p));
    if (!plan->delegates()) continue;
    for (size_t d = 0; d < plan->delegates()->size(); ++d) {
      const fb::BackendDelegate* del = plan->delegates()->Get(static_cast<uint32_t>(d));
      Delegate info{p, d, str(del->id()), fb::EnumNameDataLocation(del->processed()->location()),
                    del->processed()->index(), file.delegate_payload(p, d).value().size(), {}};
      if (del->compile_specs())
        for (const fb::CompileSpec* cs : *del->compile_specs()) info.compile_specs.push_back(str(cs->key()));
      delegates.push_back(std::move(info));
    }
  }

  struct Named {
    std::string key;
    uint32_t segment;
    uint64_t size;
  };
  std::vector<Named> named;
  uint64_t named_bytes = 0;
  if (program.named_data()) {
    for (const fb::NamedData* n : *program.named_data()) {
      uint64_t size = file.segment(n->segment_index()).value().size();
      named.push_back({str(n->key()), n->segment_index(), size});
      named_bytes += size;
    }
  }

  std::vector<std::pair<uint64_t, uint64_t>> segments;
  uint64_t segment_bytes = 0;
  if (program.segments())
    for (const fb::DataSegment* s : *program.segments()) {
      segments.emplace_back(s->offset(), s->size());
      segment_bytes += s->size();
    }
  const uint64_t base = file.has_extended_header() ? file.extended_header().segment_base_offset : 0;

  if (as_json) {
    json j;
    j["file"] = path;
    j["format"] = "pte";
    j["file_size"] = file.file_size();
    j["program_size"] = file.program_size();
    j["segment_base_offset"] = base;
    j["version"] = program.version();
    j["plans"] = json::array();
    for (const PlanSummary& s : plans) {
      json pj;
      pj["name"] = s.name;
      pj["instructions"] = s.instructions;
      pj["kernel_calls"] = s.kernel_calls;
      pj["delegate_calls"] = s.delegate_calls;
      pj["other_instructions"] = s.other_instructions;
      pj["value_count"] = s.value_count;
      pj["values"] = s.values;
      pj["inputs"] = json::array();
      for (const Io& io : s.inputs) pj["inputs"].push_back(io_json(io));
      pj["outputs"] = json::array();
      for (const Io& io : s.outputs) pj["outputs"].push_back(io_json(io));
      pj["non_const_buffer_sizes"] = s.buffer_sizes;
      j["plans"].push_back(std::move(pj));
    }
    j["constant_count"] = constant_count;
    j["constant_bytes"] = constant_bytes;
    j["constants_inline"] = constants_inline;
    j["segments"] = json::array();
    for (const auto& [offset, size] : segments)
      j["segments"].push_back({{"offset", offset}, {"size", size}, {"file_offset", base + offset}});
    j["delegates"] = json::array();
    for (const Delegate& d : delegates)
      j["delegates"].push_back({{"plan", d.plan},
                                {"index", d.index},
                                {"backend", d.backend},
                                {"location", d.location},
                                {"location_index", d.location_index},
                                {"size", d.size},
                                {"compile_specs", d.compile_specs}});
    j["named_data"] = json::array();
    for (const Named& n : named) j["named_data"].push_back({{"key", n.key}, {"segment", n.segment}, {"size", n.size}});
    // Keys and ids come from the file: replace invalid UTF-8 rather than fail.
    fmt::print("{}\n", j.dump(2, ' ', false, json::error_handler_t::replace));
    return 0;
  }

  fmt::print("{}\n", path);
  fmt::print("  ExecuTorch program (ET12), version {}, {} bytes: flatbuffer {} bytes", program.version(),
             grouped(file.file_size()), grouped(file.program_size()));
  if (base) fmt::print(", segment data from byte {}", grouped(base));
  fmt::print("\n");
  for (const PlanSummary& s : plans) {
    fmt::print("plan '{}': {} instructions, {} values\n", s.name, s.instructions, s.value_count);
    auto kernels = by_count(s.kernel_calls);
    int64_t kernel_total = 0;
    for (const auto& [op, n] : kernels) kernel_total += n;
    fmt::print("  kernel calls: {} ({} operators)\n", kernel_total, kernels.size());
    for (const auto& [op, n] : kernels) fmt::print("    {:>5}  {}\n", n, op);
    if (!s.delegate_calls.empty()) {
      fmt::print("  delegate calls:\n");
      for (const auto& [backend, n] : by_count(s.delegate_calls)) fmt::print("    {:>5}  {}\n", n, backend);
    }
    for (const auto& [kind, n] : s.other_instructions) fmt::print("  {} instructions: {}\n", kind, n);
    std::vector<std::string> kinds;
    for (const auto& [kind, n] : by_count(s.values)) kinds.push_back(fmt::format("{} {}", n, kind));
    fmt::print("  values: {}\n", fmt::join(kinds, ", "));
    fmt::print("  inputs:\n");
    for (const Io& io : s.inputs) fmt::print("    {}\n", io_text(io));
    fmt::print("  outputs:\n");
    for (const Io& io : s.outputs) fmt::print("    {}\n", io_text(io));
    uint64_t planned = 0;
    for (size_t i = 1; i < s.buffer_sizes.size(); ++i) planned += static_cast<uint64_t>(s.buffer_sizes[i]);
    fmt::print("  planned memory: {} bytes in {} buffer{} (non_const_buffer_sizes [{}])\n", grouped(planned),
               s.buffer_sizes.empty() ? 0 : s.buffer_sizes.size() - 1, s.buffer_sizes.size() == 2 ? "" : "s",
               fmt::join(s.buffer_sizes, ", "));
  }
  fmt::print("constants: {} ({} bytes{})\n", constant_count, grouped(constant_bytes),
             constants_inline ? ", inline in the flatbuffer" : "");
  fmt::print("segments: {} ({} bytes)\n", segments.size(), grouped(segment_bytes));
  for (size_t i = 0; i < segments.size(); ++i)
    fmt::print("  {:>4}  offset {:>12}  size {:>12}\n", i, grouped(segments[i].first), grouped(segments[i].second));
  fmt::print("delegates: {}\n", delegates.size());
  for (const Delegate& d : delegates)
    fmt::print("  plan {} delegate {:<4} {:<20} {} bytes ({} {}){}\n", d.plan, d.index, d.backend, grouped(d.size),
               d.location == "SEGMENT" ? "segment" : "inline", d.location_index,
               d.compile_specs.empty() ? "" : fmt::format(", compile specs: {}", fmt::join(d.compile_specs, ", ")));
  fmt::print("named data: {} ({} bytes)\n", named.size(), grouped(named_bytes));
  for (const Named& n : named) fmt::print("  {:<66} {:>12} bytes (segment {})\n", n.key, grouped(n.size), n.segment);
  return 0;
}

}  // namespace kiln::cli
