#include "kiln/pt2/pt2_reader.h"

#include "json_reader.h"
#include "kiln/core/enum_names.h"
#include "kiln/core/error.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// Reads the torch.export archive layout (torch/export/pt2_archive) and the
// serialized ExportedProgram JSON (torch/_export/serde/schema.py, schema 8.x).
// Every field is checked before use: a malformed archive is a kiln::Error with
// one line naming the file and the place, never a crash. The JSON layer
// (Reader) is json_reader.h.

namespace kiln::pt2 {

using namespace detail;

namespace {

constexpr std::string_view kOpPrefix = "torch.ops.";

std::string strip_op_prefix(const std::string& target) {
  if (target.starts_with(kOpPrefix)) return target.substr(kOpPrefix.size());
  return target;
}

// Finds "<root>/models/<name>.json"; returns {root with trailing '/', name}.
std::pair<std::string, std::string> locate_model(const Pt2Archive& archive) {
  std::vector<std::pair<std::string, std::string>> found;
  for (const auto& e : archive.entries()) {
    auto pos = e.find("models/");
    if (pos == std::string::npos || !e.ends_with(".json")) continue;
    std::string root = e.substr(0, pos);
    if (!root.empty() && (root.back() != '/' || root.find('/') != root.size() - 1)) continue;
    std::string name = e.substr(pos + 7, e.size() - pos - 7 - 5);
    if (name.empty() || name.find('/') != std::string::npos) continue;
    found.emplace_back(root, name);
  }
  if (found.empty())
    fail("{}: archive has no serialized graph (expected an entry <archive>/models/<name>.json); "
         "is this a torch.export.save file?",
         archive.path());
  if (found.size() > 1) {
    auto it = std::find_if(found.begin(), found.end(), [](const auto& f) { return f.second == "model"; });
    if (it == found.end()) fail("{}: archive holds {} models; kiln reads single-model archives", archive.path(), found.size());
    return *it;
  }
  return found.front();
}

void read_payload_config(const Reader& r, const Pt2Archive& archive, const std::string& root,
                         const std::string& config_entry, const std::string& data_dir,
                         std::map<std::string, std::pair<std::string, json>>& out) {
  if (!archive.contains(config_entry)) return;
  json cfg;
  try {
    cfg = json::parse(archive.read_text(config_entry));
  } catch (const json::exception& e) {
    r.bad(config_entry, fmt::format("invalid JSON ({})", e.what()));
  }
  const json& entries = r.field(cfg, "config", config_entry);
  if (!entries.is_object()) r.bad(config_entry, "'config' is not an object");
  for (auto it = entries.begin(); it != entries.end(); ++it)
    out[it.key()] = {root + data_dir, it.value()};
}

// The innermost module of a node's serialized nn_module_stack: entries
// "key,path,type" joined by ';', outermost first (torch.export's serializer);
// a path may hold commas inside brackets or quotes ("L['self'].h[0]"). The
// path comes back as an attribute path: "transformer.h.0.attn".
void innermost_module(const std::string& stack, std::string* path, std::string* type) {
  std::string_view last(stack);
  if (auto semi = last.rfind(';'); semi != std::string_view::npos) last = last.substr(semi + 1);
  std::vector<std::string> parts(1);
  int depth = 0;
  char quote = 0;
  for (char c : last) {
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '[' || c == '(' || c == '{') {
      ++depth;
    } else if ((c == ']' || c == ')' || c == '}') && depth > 0) {
      --depth;
    } else if (c == ',' && depth == 0) {
      parts.emplace_back();
      continue;
    }
    parts.back() += c;
  }
  if (parts.size() < 3) return;
  *type = parts.back();
  std::string raw = parts[1];
  for (size_t k = 2; k + 1 < parts.size(); ++k) raw += "," + parts[k];
  // L['self'].a.b[0]['c'] / L__self__.a -> a.b.0.c
  for (std::string_view root : {"L['self']", "L[\"self\"]", "L__self__", "self"})
    if (raw.starts_with(root) && (raw.size() == root.size() || raw[root.size()] == '.' || raw[root.size()] == '[')) {
      raw = raw.substr(root.size());
      break;
    }
  std::string out;
  for (char c : raw) {
    if (c == '[') {
      out += '.';
    } else if (c != ']' && c != '\'' && c != '"') {
      out += c;
    }
  }
  while (!out.empty() && out.front() == '.') out.erase(out.begin());
  *path = out;
}

}  // namespace

std::string_view constant_kind_name(ConstantTensor::Kind kind) {
  static constexpr std::array<std::string_view, 3> kNames{"parameter", "buffer", "tensor_constant"};
  return enum_name<ConstantTensor::Kind::TensorConstant>(kind, kNames);
}

const ConstantTensor* ExportedProgram::find_constant(std::string_view name) const {
  for (const auto& c : constants)
    if (c.name == name) return &c;
  return nullptr;
}

namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);  // inf, nan
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// 16-bit float elements (bfloat16 or float16) as float32, exactly
void widen(ScalarType from, const std::byte* in, size_t n, float* out) {
  if (from == ScalarType::BFloat16) {  // a loop of its own: the compiler vectorises it
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      std::memcpy(out + i, &u, 4);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = half_to_float(h);
  }
}

// n 16-bit elements stored at bytes [2n, 4n) of `buf` widened in place to n floats at [0, 4n): element i is read
// before it is written, and its float [4i, 4i + 4) reaches no element after it (4i + 4 <= 2n + 2j for every j > i),
// so one forward pass needs no second buffer
void widen_in_place(ScalarType from, std::byte* buf, size_t n) {
  std::byte* in = buf + 2 * n;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    float f;
    if (from == ScalarType::BFloat16) {
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      std::memcpy(&f, &u, 4);
    } else {
      f = half_to_float(h);
    }
    std::memcpy(buf + 4 * i, &f, 4);
  }
}

}  // namespace

void ExportedProgram::stream_constant(const ConstantTensor& c,
                                      const std::function<void(std::span<const std::byte>)>& sink) const {
  if (c.stored_dtype) {  // read as stored, widened chunk by chunk (a chunk may end inside an element)
    ConstantTensor stored = c;
    stored.meta.dtype = *c.stored_dtype;
    stored.stored_dtype.reset();
    std::vector<float> wide;
    std::byte carry{};
    bool carrying = false;
    stream_constant(stored, [&](std::span<const std::byte> chunk) {
      if (carrying && !chunk.empty()) {
        const std::byte pair[2] = {carry, chunk[0]};
        float f;
        widen(*c.stored_dtype, pair, 1, &f);
        sink(std::as_bytes(std::span<const float>(&f, 1)));
        chunk = chunk.subspan(1);
        carrying = false;
      }
      const size_t n = chunk.size() / 2;
      wide.resize(n);
      widen(*c.stored_dtype, chunk.data(), n, wide.data());
      if (n) sink(std::as_bytes(std::span<const float>(wide.data(), n)));
      if (chunk.size() % 2) carry = chunk.back(), carrying = true;
    });
    check(!carrying, "'{}': the archive holds a partial element", c.name);
    return;
  }
  const auto& m = c.meta;
  const auto esize = static_cast<uint64_t>(element_size(m.dtype));
  if (m.numel() == 0) return;
  if (m.is_contiguous()) {
    archive->stream(c.entry, c.entry_offset + static_cast<uint64_t>(m.storage_offset) * esize, static_cast<uint64_t>(m.nbytes()), sink);
    return;
  }
  // A strided view of its storage (e.g. a transposed or sliced parameter):
  // read the storage span it reaches once, then gather row-major.
  std::vector<std::byte> storage(static_cast<size_t>(m.storage_extent()) * esize);
  archive->read(c.entry, c.entry_offset, storage);
  const size_t rank = m.sizes.size();
  std::vector<int64_t> index(rank, 0);
  std::vector<std::byte> row;
  const int64_t inner = rank ? m.sizes.back() : 1;
  const int64_t inner_stride = rank ? m.strides.back() : 1;
  row.resize(static_cast<size_t>(inner) * esize);
  for (int64_t done = 0; done < m.numel(); done += inner) {
    int64_t base = m.storage_offset;
    for (size_t d = 0; d + 1 < rank; ++d) base += index[d] * m.strides[d];
    for (int64_t i = 0; i < inner; ++i)
      std::memcpy(row.data() + static_cast<size_t>(i) * esize,
                  storage.data() + static_cast<size_t>(base + i * inner_stride) * esize, esize);
    sink(row);
    for (size_t d = rank - 1; d-- > 0;) {  // advance the outer index, odometer style
      if (++index[d] < m.sizes[d]) break;
      index[d] = 0;
    }
  }
}

void ExportedProgram::read_constant(const ConstantTensor& c, std::span<std::byte> out) const {
  check(out.size() == static_cast<size_t>(c.meta.nbytes()), "read_constant('{}'): buffer holds {} bytes, tensor {}",
        c.name, out.size(), c.meta.nbytes());
  size_t pos = 0;
  stream_constant(c, [&](std::span<const std::byte> chunk) {
    if (chunk.empty()) return;
    std::memcpy(out.data() + pos, chunk.data(), chunk.size());
    pos += chunk.size();
  });
}

void ExportedProgram::read_constant_range(const ConstantTensor& c, uint64_t offset, std::span<std::byte> out) const {
  const auto nbytes = static_cast<uint64_t>(c.meta.nbytes());
  check(offset <= nbytes && out.size() <= nbytes - offset, "read_constant_range('{}'): {} bytes at {} past its {} bytes",
        c.name, out.size(), offset, nbytes);
  if (out.empty()) return;  // (an empty span's data() may be null: no memcpy of it, even of 0 bytes)
  if (c.stored_dtype && c.meta.is_contiguous() && offset % 4 == 0 && out.size() % 4 == 0) {
    // whole elements: read as stored into the back half of `out`, widened in place (no buffer the size of the range:
    // a table streams through here in blocks of 32 MB)
    const size_t n = out.size() / 4;
    archive->read(c.entry, c.entry_offset + (static_cast<uint64_t>(c.meta.storage_offset) + offset / 4) * 2,
                  out.subspan(2 * n));
    widen_in_place(*c.stored_dtype, out.data(), n);
    return;
  }
  if (c.stored_dtype && c.meta.is_contiguous()) {  // the stored elements that hold the range, widened
    const uint64_t first = offset / 4, last = (offset + out.size() + 3) / 4;
    std::vector<std::byte> stored(static_cast<size_t>((last - first) * 2));
    archive->read(c.entry, c.entry_offset + (static_cast<uint64_t>(c.meta.storage_offset) + first) * 2, stored);
    std::vector<float> wide(static_cast<size_t>(last - first));
    widen(*c.stored_dtype, stored.data(), wide.size(), wide.data());
    std::memcpy(out.data(), reinterpret_cast<const std::byte*>(wide.data()) + (offset - first * 4), out.size());
    return;
  }
  if (c.meta.is_contiguous()) {
    archive->read(c.entry, c.entry_offset + static_cast<uint64_t>(c.meta.storage_offset) * static_cast<uint64_t>(element_size(c.meta.dtype)) + offset, out);
    return;
  }
  std::vector<std::byte> all(nbytes);
  read_constant(c, all);
  std::memcpy(out.data(), all.data() + offset, out.size());
}

uint32_t ExportedProgram::content_crc32(const ConstantTensor& c) const {
  uLong crc = crc32(0L, Z_NULL, 0);
  stream_constant(c, [&](std::span<const std::byte> chunk) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(chunk.data()), static_cast<uInt>(chunk.size()));
  });
  return static_cast<uint32_t>(crc);
}

// True for a node that only computes or checks symbols: a SymInt/SymBool
// output (aten.sym_size.int, operator.mul), or a runtime assert on a SymBool.
bool is_symbolic_node(const json& jn) {
  auto outs = jn.find("outputs");
  if (outs != jn.end() && outs->is_array())
    for (const auto& o : *outs)
      if (o.is_object() && o.size() == 1 &&
          (o.contains("as_sym_int") || o.contains("as_sym_bool") || o.contains("as_sym_float")))
        return true;
  auto target = jn.find("target");
  if (target == jn.end() || !target->is_string()) return false;
  const std::string& t = target->get_ref<const std::string&>();
  if (t.find("_assert_scalar") == std::string::npos && t.find("sym_constrain_range") == std::string::npos)
    return false;
  auto ins = jn.find("inputs");
  if (ins != jn.end() && ins->is_array())
    for (const auto& i : *ins)
      if (auto a = i.find("arg"); a != i.end() && a->is_object() && (a->contains("as_sym_bool") || a->contains("as_sym_int")))
        return true;
  return false;
}

// True for an argument that names a graph SymInt ({"as_sym_int": {"as_name": ...}} or a list with one).
bool has_symbol_reference(const json& arg) {
  if (!arg.is_object()) return false;
  auto named = [](const json& e) { return e.is_object() && e.contains("as_name"); };
  if (auto it = arg.find("as_sym_int"); it != arg.end()) return named(*it);
  if (auto it = arg.find("as_sym_ints"); it != arg.end() && it->is_array())
    for (const auto& e : *it)
      if (named(e)) return true;
  return false;
}

// range_constraints -> symbols (each with a finite upper bound).
std::vector<graph::Symbol> read_symbols(const Reader& r, const json& doc) {
  std::vector<graph::Symbol> out;
  auto it = doc.find("range_constraints");
  if (it == doc.end() || !it->is_object()) return out;
  for (auto rc = it->begin(); rc != it->end(); ++rc) {
    std::string where = fmt::format("range_constraints '{}'", rc.key());
    graph::Symbol s;
    s.name = rc.key();
    const json& lo = r.field(rc.value(), "min_val", where);
    const json& hi = r.field(rc.value(), "max_val", where);
    s.min = lo.is_number_integer() ? lo.get<int64_t>() : 0;
    if (!hi.is_number_integer() || hi.get<int64_t>() > (int64_t{1} << 31))
      r.bad(where, "dynamic size has no upper bound; kiln plans memory at the bound: export with "
                   "torch.export.Dim(name, max=N)");
    s.max = hi.get<int64_t>();
    if (s.max < s.min || s.max < 0) r.bad(where, fmt::format("empty range [{}, {}]", s.min, s.max));
    out.push_back(std::move(s));
  }
  return out;
}

namespace {
// a schema version's part as the file gives it: an integer, else "?" (informational: never a reason to refuse, and
// never converted from a float or a string, whose conversion to int is undefined or throws)
std::string version_part(const json& v, const char* key) {
  const auto it = v.find(key);
  if (it == v.end()) return "0";
  if (it->is_number_unsigned()) return std::to_string(it->get<uint64_t>());
  if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
  return "?";
}

ExportedProgram read_pt2_entries(const std::string& path, const SymbolBinding* binding);
}  // namespace

// Every field is read through Reader's checked accessors; this catch is the net under them: a JSON value of a type
// the reading did not expect (nlohmann's type_error or out_of_range from a path not yet written that way) is one
// kiln::Error naming the archive, never a foreign exception out of the reader (fuzz_pt2_graph, docs/FUZZING.md).
ExportedProgram read_pt2(const std::string& path, const SymbolBinding* binding) {
  try {
    return read_pt2_entries(path, binding);
  } catch (const json::exception& e) {
    fail("{}: a JSON entry of the archive is not of the form kiln reads ({})", path, e.what());
  }
}

namespace {
ExportedProgram read_pt2_entries(const std::string& path, const SymbolBinding* binding) {
  ExportedProgram ep;
  ep.path = path;
  auto archive = std::make_shared<Pt2Archive>(path);
  ep.archive = archive;
  auto [root, model_name] = locate_model(*archive);
  ep.model_name = model_name;

  if (archive->contains(root + "archive_format")) {
    std::string fmt_value = archive->read_text(root + "archive_format");
    check(fmt_value == "pt2", "{}: archive_format is '{}', expected 'pt2'", path, fmt_value);
  }
  if (archive->contains(root + "byteorder")) {
    std::string order = archive->read_text(root + "byteorder");
    check(order == "little", "{}: byteorder is '{}'; kiln reads little-endian archives only", path, order);
  }

  Reader r{path, &ep.graph, {}, {}};
  const std::string model_entry = root + "models/" + model_name + ".json";
  json doc;
  try {
    doc = json::parse(archive->read_text(model_entry));
  } catch (const json::exception& e) {
    r.bad(model_entry, fmt::format("invalid JSON ({})", e.what()));
  }
  if (!doc.is_object()) r.bad(model_entry, "expected a JSON object");

  if (auto it = doc.find("torch_version"); it != doc.end() && it->is_string()) ep.torch_version = *it;
  if (auto it = doc.find("schema_version"); it != doc.end() && it->is_object())
    ep.schema_version = fmt::format("{}.{}", version_part(*it, "major"), version_part(*it, "minor"));
  if (auto it = doc.find("verifiers"); it != doc.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    ep.dialect = (*it)[0].get<std::string>();
  else if (auto d = doc.find("dialect"); d != doc.end() && d->is_string())
    ep.dialect = *d;

  std::map<std::string, std::pair<std::string, json>> payloads;  // fqn -> (data dir, PayloadMeta)
  read_payload_config(r, *archive, root, root + "data/weights/" + model_name + "_weights_config.json", "data/weights/",
                      payloads);
  read_payload_config(r, *archive, root, root + "data/constants/" + model_name + "_constants_config.json",
                      "data/constants/", payloads);
  {
    json& gm_mut = doc["graph_module"];
    if (gm_mut.is_object() && gm_mut["graph"].is_object() && gm_mut["signature"].is_object())
      unwrap_subclass_parameters(r, *archive, gm_mut["graph"], gm_mut["signature"], payloads);
  }
  const json& gm = r.field(doc, "graph_module", model_entry);
  const json& g = r.field(gm, "graph", "graph_module");

  // Symbols and the values the graph is read at.
  ep.graph.symbols = read_symbols(r, doc);
  for (const auto& s : ep.graph.symbols) {
    int64_t v = s.max;
    if (binding) {
      auto it = binding->find(s.name);
      if (it != binding->end()) v = it->second;
      if (v < s.min || v > s.max) r.bad("range_constraints", fmt::format("{} = {} is outside [{}, {}]", s.name, v, s.min, s.max));
    }
    r.binding[s.name] = v;
  }
  if (auto sv = g.find("sym_int_values"); sv != g.end() && sv->is_object())
    for (auto it = sv->begin(); it != sv->end(); ++it) {
      graph::SymExpr e;
      r.sym_int_expr(it.value(), fmt::format("SymInt '{}'", it.key()), &e);
      r.sym_values[it.key()] = std::move(e);
    }

  // Tensor values first: every node argument refers to them by name.
  const json& tvs = r.field(g, "tensor_values", "graph");
  if (!tvs.is_object()) r.bad("graph.tensor_values", "expected an object");
  for (auto it = tvs.begin(); it != tvs.end(); ++it)
    ep.graph.add_value(it.key(), r.tensor_meta(it.value(), fmt::format("tensor '{}'", it.key())));

  for (const auto& in : r.as_array(r.field(g, "inputs", "graph"), "graph.inputs")) {
    auto [kind, v] = r.union_member(in, "graph input");
    if (kind != "as_tensor") r.bad("graph input", fmt::format("input of kind '{}'; kiln supports tensor inputs only", kind));
    ep.graph.inputs.push_back(r.tensor_ref(*v, "graph input"));
  }

  int32_t index = 0;
  for (const auto& jn : r.as_array(r.field(g, "nodes", "graph"), "graph.nodes")) {
    if (!ep.graph.symbols.empty() && is_symbolic_node(jn)) continue;  // its values are known at the binding
    graph::Node node;
    std::string where = fmt::format("node #{}", index);
    if (auto it = jn.find("name"); it != jn.end() && it->is_string()) node.name = *it;
    if (!node.name.empty()) where = fmt::format("node '{}'", node.name);
    node.target = strip_op_prefix(r.as_string(r.field(jn, "target", where), where));
    where += fmt::format(" ({})", node.target);
    for (const auto& ji : r.as_array(r.field(jn, "inputs", where), where)) {
      graph::NamedArgument na;
      na.name = r.as_string(r.field(ji, "name", where), where);
      na.arg = r.argument(r.field(ji, "arg", where), fmt::format("{} input '{}'", where, na.name));
      if (auto it = ji.find("kind"); it != ji.end() && it->is_number_integer()) na.keyword = it->get<int64_t>() == 2;
      node.symbolic = node.symbolic || has_symbol_reference(r.field(ji, "arg", where));
      node.inputs.push_back(std::move(na));
    }
    for (const auto& jo : r.as_array(r.field(jn, "outputs", where), where)) {
      Argument out = r.argument(jo, where + " output");
      if (out.kind != Argument::Kind::Tensor && out.kind != Argument::Kind::Tensors && out.kind != Argument::Kind::None)
        r.bad(where, fmt::format("output of kind '{}'; kiln supports tensor outputs only",
                                 graph::argument_kind_name(out.kind)));
      for (ValueId v : out.tensor_ids()) {
        auto& value = ep.graph.values[static_cast<size_t>(v)];
        if (value.producer >= 0) r.bad(where, fmt::format("tensor '{}' is written by two nodes", value.name));
        value.producer = index;
      }
      node.outputs.push_back(std::move(out));
    }
    if (auto md = jn.find("metadata"); md != jn.end() && md->is_object()) {
      if (auto st = md->find("stack_trace"); st != md->end() && st->is_string()) node.stack_trace = *st;
      if (auto ms = md->find("nn_module_stack"); ms != md->end() && ms->is_string())
        innermost_module(ms->get<std::string>(), &node.module_path, &node.module_type);
    }
    node.source_nodes = {node.name};
    ep.graph.nodes.push_back(std::move(node));
    ++index;
  }

  for (const auto& out : r.as_array(r.field(g, "outputs", "graph"), "graph.outputs"))
    ep.graph.outputs.push_back(r.argument(out, "graph output"));

  // Pytree specs of the root module's call (ExecuTorch programs carry them too).
  if (auto mcg = gm.find("module_call_graph"); mcg != gm.end() && mcg->is_array()) {
    for (const auto& entry : *mcg) {
      const auto fqn = entry.is_object() ? entry.find("fqn") : entry.end();
      if (!entry.is_object() || fqn == entry.end() || !fqn->is_string() || !fqn->get_ref<const std::string&>().empty())
        continue;
      if (auto s = entry.find("signature"); s != entry.end() && s->is_object()) {
        if (auto i = s->find("in_spec"); i != s->end() && i->is_string()) ep.inputs_spec = *i;
        if (auto o = s->find("out_spec"); o != s->end() && o->is_string()) ep.outputs_spec = *o;
      }
    }
  }

  // Signature.
  const json& sig = r.field(gm, "signature", "graph_module");
  for (const auto& js : r.as_array(r.field(sig, "input_specs", "signature"), "signature.input_specs")) {
    auto [kind, v] = r.union_member(js, "input spec");
    graph::InputSpec spec;
    using IK = graph::InputSpec::Kind;
    std::string where = "input spec '" + kind + "'";
    auto arg_name = [&](const json& arg) { return r.as_string(r.field(arg, "name", where), where); };
    if (kind == "user_input") {
      spec.kind = IK::UserInput;
      auto [ak, av] = r.union_member(r.field(*v, "arg", where), where);
      if (ak != "as_tensor") r.bad(where, fmt::format("user input of kind '{}'; kiln supports tensor inputs only", ak));
      spec.arg_name = arg_name(*av);
    } else if (kind == "parameter") {
      spec.kind = IK::Parameter;
      spec.arg_name = arg_name(r.field(*v, "arg", where));
      spec.target = r.as_string(r.field(*v, "parameter_name", where), where);
    } else if (kind == "buffer") {
      spec.kind = IK::Buffer;
      spec.arg_name = arg_name(r.field(*v, "arg", where));
      spec.target = r.as_string(r.field(*v, "buffer_name", where), where);
      if (auto it = v->find("persistent"); it != v->end() && it->is_boolean()) spec.persistent = *it;
    } else if (kind == "tensor_constant") {
      spec.kind = IK::TensorConstant;
      spec.arg_name = arg_name(r.field(*v, "arg", where));
      spec.target = r.as_string(r.field(*v, "tensor_constant_name", where), where);
    } else if (kind == "custom_obj" || kind == "token" || kind == "constant_input") {
      r.bad(where, "input kind not supported by kiln");
    } else {
      r.bad(where, "unknown input spec kind");
    }
    ep.signature.inputs.push_back(std::move(spec));
  }
  if (ep.signature.inputs.size() != ep.graph.inputs.size())
    r.bad("signature", fmt::format("{} input specs for {} graph inputs", ep.signature.inputs.size(), ep.graph.inputs.size()));
  for (size_t i = 0; i < ep.graph.inputs.size(); ++i)
    if (ep.graph.value(ep.graph.inputs[i]).name != ep.signature.inputs[i].arg_name)
      r.bad("signature", fmt::format("input spec {} names '{}' but graph input {} is '{}'", i,
                                     ep.signature.inputs[i].arg_name, i, ep.graph.value(ep.graph.inputs[i]).name));

  for (const auto& js : r.as_array(r.field(sig, "output_specs", "signature"), "signature.output_specs")) {
    auto [kind, v] = r.union_member(js, "output spec");
    std::string where = "output spec '" + kind + "'";
    graph::OutputSpec spec;
    using OK = graph::OutputSpec::Kind;
    static const std::map<std::string, std::pair<OK, const char*>> kinds = {
        {"user_output", {OK::UserOutput, nullptr}},
        {"loss_output", {OK::LossOutput, nullptr}},
        {"buffer_mutation", {OK::BufferMutation, "buffer_name"}},
        {"user_input_mutation", {OK::UserInputMutation, "user_input_name"}},
        {"parameter_mutation", {OK::ParameterMutation, "parameter_name"}},
        {"gradient_to_parameter", {OK::GradientToParameter, "parameter_name"}},
        {"gradient_to_user_input", {OK::GradientToUserInput, "user_input_name"}},
        {"token", {OK::Token, nullptr}},
    };
    auto k = kinds.find(kind);
    if (k == kinds.end()) r.bad(where, "unknown output spec kind");
    spec.kind = k->second.first;
    const json& arg = r.field(*v, "arg", where);
    if (kind == "user_output") {
      auto [ak, av] = r.union_member(arg, where);
      if (ak == "as_tensor") spec.arg_name = r.as_string(r.field(*av, "name", where), where);
    } else {
      spec.arg_name = r.as_string(r.field(arg, "name", where), where);
    }
    if (k->second.second) spec.target = r.as_string(r.field(*v, k->second.second, where), where);
    ep.signature.outputs.push_back(std::move(spec));
  }
  if (ep.signature.outputs.size() != ep.graph.outputs.size())
    r.bad("signature", fmt::format("{} output specs for {} graph outputs", ep.signature.outputs.size(),
                                   ep.graph.outputs.size()));

  // Constant tensors: where each parameter, buffer and tensor constant's bytes live (payloads, read above).
  for (size_t i = 0; i < ep.signature.inputs.size(); ++i) {
    const auto& spec = ep.signature.inputs[i];
    ConstantTensor c;
    using IK = graph::InputSpec::Kind;
    if (spec.kind == IK::Parameter) c.kind = ConstantTensor::Kind::Parameter;
    else if (spec.kind == IK::Buffer) c.kind = ConstantTensor::Kind::Buffer;
    else if (spec.kind == IK::TensorConstant) c.kind = ConstantTensor::Kind::TensorConstant;
    else continue;
    c.name = spec.target;
    std::string where = fmt::format("{} '{}'", constant_kind_name(c.kind), c.name);
    auto p = payloads.find(c.name);
    if (p == payloads.end()) r.bad(where, "has no entry in the archive's weights or constants config");
    const json& meta = p->second.second;
    const std::string& dir = p->second.first;
    if (auto u = meta.find("use_pickle"); u != meta.end() && r.as_bool(*u, where + " use_pickle"))
      r.bad(where, "is stored pickled, and the graph does not read it as a tensor subclass's inner tensors; kiln reads "
                   "plain dense tensors and tensor subclasses' parts only");
    c.entry = dir + r.as_string(r.field(meta, "path_name", where), where);
    c.meta = r.tensor_meta(r.field(meta, "tensor_meta", where), where);
    const auto& placeholder = ep.graph.value(ep.graph.inputs[i]).meta;
    if (placeholder.sizes != c.meta.sizes || placeholder.dtype != c.meta.dtype)
      r.bad(where, "metadata disagrees with its graph input's");
    if (!archive->contains(c.entry)) r.bad(where, fmt::format("storage entry '{}' is missing", c.entry));
    c.entry_bytes = archive->entry_size(c.entry);
    if (auto off = meta.find("kiln_member_offset"); off != meta.end()) {  // a subclass's part (unwrap_subclass_parameters)
      auto non_negative = [&](const json& j, const char* name) {
        const int64_t v = r.as_int(j, where + " " + name);
        if (v < 0) r.bad(where, fmt::format("{} is negative", name));
        return static_cast<uint64_t>(v);
      };
      c.entry_offset = non_negative(*off, "kiln_member_offset");
      c.entry_bytes = non_negative(r.field(meta, "kiln_member_bytes", where), "kiln_member_bytes");
      if (r.as_int(r.field(meta, "kiln_element_bytes", where), where) != element_size(c.meta.dtype))
        r.bad(where, "its storage's element size disagrees with its dtype");
    }
    const uint64_t need = static_cast<uint64_t>(c.meta.storage_extent()) * static_cast<uint64_t>(element_size(c.meta.dtype));
    if (c.entry_bytes < need)
      r.bad(where, fmt::format("storage entry '{}' holds {} bytes but its metadata needs {}", c.entry, c.entry_bytes, need));
    ep.constants.push_back(std::move(c));
  }
  return ep;
}
}  // namespace

}  // namespace kiln::pt2
