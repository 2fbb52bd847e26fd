// Test-only: reads a .pte with kiln's loader, turns it into a ProgramModel
// and writes it again with kiln's writer, streaming constants, delegate
// payloads and named data straight from the mapped input. Lets the tests run
// kiln-written versions of real ExecuTorch programs (GPT-2, portable and
// XNNPACK) in ExecuTorch's runtime and compare the files' segments.
//
//   kiln_pte_rewrite IN.pte OUT.pte
#include "kiln/core/error.h"
#include "kiln/pte/pte_writer.h"
#include "kiln/fb/kiln_program_generated.h"
#include "kiln/runtime/pte_file.h"

#include <cstdio>
#include <map>
#include <utility>

using namespace kiln;

namespace {

pte::DataBlob view_blob(std::span<const std::byte> bytes) {
  pte::DataBlob b;
  b.size = bytes.size();
  b.write = [bytes](const std::function<void(std::span<const std::byte>)>& sink) {
    if (!bytes.empty()) sink(bytes);
  };
  return b;
}

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

template <typename T>
std::vector<int32_t> ints(const flatbuffers::Vector<T>* v) {
  std::vector<int32_t> out;
  if (v)
    for (T x : *v) out.push_back(static_cast<int32_t>(x));
  return out;
}

pte::Value convert_value(const fb::EValue& v) {
  switch (v.val_type()) {
    case fb::KernelTypes::Null: return pte::NoneValue{};
    case fb::KernelTypes::Int: return v.val_as_Int()->int_val();
    case fb::KernelTypes::Bool: return v.val_as_Bool()->bool_val();
    case fb::KernelTypes::Double: return v.val_as_Double()->double_val();
    case fb::KernelTypes::String: return str(v.val_as_String()->string_val());
    case fb::KernelTypes::IntList: return pte::IntList{ints(v.val_as_IntList()->items())};
    case fb::KernelTypes::TensorList: return pte::TensorList{ints(v.val_as_TensorList()->items())};
    case fb::KernelTypes::OptionalTensorList:
      return pte::OptionalTensorList{ints(v.val_as_OptionalTensorList()->items())};
    case fb::KernelTypes::DoubleList: {
      pte::DoubleList l;
      if (const auto* items = v.val_as_DoubleList()->items()) l.items.assign(items->begin(), items->end());
      return l;
    }
    case fb::KernelTypes::BoolList: {
      pte::BoolList l;
      if (const auto* items = v.val_as_BoolList()->items())
        for (auto b : *items) l.items.push_back(b != 0);
      return l;
    }
    case fb::KernelTypes::Tensor: {
      const fb::Tensor* t = v.val_as_Tensor();
      check(t->shape_dynamism() == fb::TensorShapeDynamism::STATIC && !t->extra_tensor_info(),
            "dynamic shapes and extra tensor info are not in the ProgramModel");
      pte::TensorValue out;
      out.dtype = static_cast<ScalarType>(t->scalar_type());
      out.sizes = ints(t->sizes());
      if (t->dim_order()) out.dim_order.assign(t->dim_order()->begin(), t->dim_order()->end());
      out.constant_index = t->data_buffer_idx();
      if (const auto* a = t->allocation_info())
        out.allocation =
            pte::Allocation{a->memory_id(), (uint64_t{a->memory_offset_high()} << 32) | a->memory_offset_low()};
      return out;
    }
    default:
      fail("value of unknown kind {}", static_cast<int>(v.val_type()));
  }
}

pte::Program convert(const rt::PteFile& file) {
  const fb::Program& p = file.program();
  pte::Program out;
  out.version = p.version();
  out.constants.clear();
  for (size_t i = 0; i < file.constant_count(); ++i) out.constants.push_back(view_blob(file.constant(i).value()));

  std::map<std::pair<int, uint32_t>, uint32_t> payload_index;  // (location, index) -> payload
  for (uint32_t pi = 0; pi < p.execution_plan()->size(); ++pi) {
    const fb::ExecutionPlan& plan = *p.execution_plan()->Get(pi);
    pte::ExecutionPlan mp;
    mp.name = str(plan.name());
    if (const auto* meta = plan.container_meta_type()) {
      mp.encoded_inputs_spec = str(meta->encoded_inp_str());
      mp.encoded_outputs_spec = str(meta->encoded_out_str());
    }
    for (const fb::EValue* v : *plan.values()) mp.values.push_back(convert_value(*v));
    mp.inputs = ints(plan.inputs());
    mp.outputs = ints(plan.outputs());
    check(plan.chains() && plan.chains()->size() == 1, "plan '{}' does not have exactly one chain", mp.name);
    for (const fb::Instruction* ins : *plan.chains()->Get(0)->instructions()) {
      if (const auto* k = ins->instr_args_as_KernelCall())
        mp.instructions.push_back(pte::KernelCall{k->op_index(), ints(k->args())});
      else if (const auto* d = ins->instr_args_as_DelegateCall())
        mp.instructions.push_back(pte::DelegateCall{d->delegate_index(), ints(d->args())});
      else if (const auto* m = ins->instr_args_as_MoveCall())
        mp.instructions.push_back(pte::MoveCall{m->move_from(), m->move_to()});
      else if (const auto* j = ins->instr_args_as_JumpFalseCall())
        mp.instructions.push_back(pte::JumpFalseCall{j->cond_value_index(), j->destination_instruction()});
      else if (const auto* f = ins->instr_args_as_FreeCall())
        mp.instructions.push_back(pte::FreeCall{f->value_index()});
    }
    if (plan.operators())
      for (const fb::Operator* op : *plan.operators()) mp.operators.push_back({str(op->name()), str(op->overload())});
    if (plan.delegates()) {
      for (uint32_t di = 0; di < plan.delegates()->size(); ++di) {
        const fb::BackendDelegate& d = *plan.delegates()->Get(di);
        auto key = std::make_pair(static_cast<int>(d.processed()->location()), d.processed()->index());
        auto [it, added] = payload_index.emplace(key, static_cast<uint32_t>(out.delegate_payloads.size()));
        if (added) out.delegate_payloads.push_back(view_blob(file.delegate_payload(pi, di).value()));
        pte::BackendDelegate md{str(d.id()), it->second, {}};
        if (d.compile_specs())
          for (const fb::CompileSpec* cs : *d.compile_specs()) {
            pte::CompileSpec spec{str(cs->key()), {}};
            if (cs->value()) spec.value.assign(cs->value()->begin(), cs->value()->end());
            md.compile_specs.push_back(std::move(spec));
          }
        mp.delegates.push_back(std::move(md));
      }
    }
    mp.non_const_buffer_sizes.assign(plan.non_const_buffer_sizes()->begin(), plan.non_const_buffer_sizes()->end());
    out.plans.push_back(std::move(mp));
  }
  if (p.named_data())
    for (const fb::NamedData* n : *p.named_data())
      out.named_data.push_back({str(n->key()), view_blob(file.segment(n->segment_index()).value())});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kiln_pte_rewrite IN.pte OUT.pte\n");
    return 2;
  }
  rt::ErrorMessage error;
  auto file = rt::PteFile::open(argv[1], &error);
  if (!file.ok()) {
    std::fprintf(stderr, "kiln_pte_rewrite: %s: %s\n", argv[1], error.c_str());
    return 1;
  }
  try {
    pte::write_pte(convert(file.value()), argv[2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln_pte_rewrite: %s\n", e.what());
    return 1;
  }
  return 0;
}
