// `kiln profile`: where a .pte's run time goes, per instruction and per step
// inside kiln's XNNPACK delegates, named after the model (module paths, source
// lines, operators, delegate regions) through the debug map `kiln lower`
// writes beside the .pte (docs/PROFILING.md). The timing is the runtime's
// (rt::Method::enable_profiling, rt::Method::delegate_steps); this file runs
// the method, collects what it recorded after each run, aggregates and prints.
#include "commands.h"
#include "method_inputs.h"
#include "etdump.h"
#include "kiln/core/error.h"
#include "kiln/core/output_file.h"
#include "kiln/io/npy.h"
#include "kiln/runtime/program.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <vector>

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ProfileOptions : TimedRunOptions {
  int64_t tokens = 0;  // LLM programs with a dynamic token count: tokens per step (0: the maximum)
  std::string trace;
  std::string etdump;
  bool debug_outputs = false;  // log the first profiled run's intermediate outputs into the ETDump
  std::string debug_buffer;    // where their bytes go (default: beside the ETDump, .debug.bin)
  int64_t debug_buffer_mb = 256;
  std::string debug_map;
  bool as_json = false;
  int top = 15;
};

// One timed thing of a run: a kernel call, a delegate's step, or what a
// delegate call spent outside its steps.
struct Item {
  enum class Kind { Instruction, Step, Overhead } kind = Kind::Instruction;
  size_t instruction = 0;
  size_t step = 0;
  std::string label;                    // kernel ("aten::mm.out") or step label
  std::vector<uint32_t> debug_handles;  // map keys (edge nodes)
  // from the debug map (empty without one)
  std::string op, module, source;
  int64_t region = -1;
  uint64_t calls = 0, ns = 0;
  int64_t positions_read = -1, cache_positions = 0;  // attention over a KV cache: its last run's
};

// The debug map beside the .pte (X.pte -> X.debug.json), if it matches the program.
struct DebugMap {
  bool present = false;
  std::string path, note;
  json nodes;                               // by debug handle
  std::vector<int64_t> instruction_handle;  // kernel calls: their edge node, else -1
  std::vector<int64_t> instruction_region;  // delegate calls: their region, else -1
};

DebugMap load_debug_map(const ProfileOptions& o, const rt::Method& m) {
  DebugMap d;
  d.path = o.debug_map.empty() ? fs::path(o.file).replace_extension(".debug.json").string() : o.debug_map;
  std::error_code ec;
  if (!fs::is_regular_file(d.path, ec)) {
    check(o.debug_map.empty(), "--debug-map {}: no such file", o.debug_map);
    d.note = fmt::format("no debug map {} (a .pte from ExecuTorch, or lowered with --no-debug-map): rows name "
                         "kernels and delegate steps only, not the model's modules",
                         d.path);
    return d;
  }
  json j;
  try {
    std::ifstream in(d.path);
    j = json::parse(in);
  } catch (const std::exception& e) {
    fail("{}: not a debug map: {}", d.path, e.what());
  }
  check(j.is_object() && j.value("format", "") == "kiln-debug-map", "{}: not a kiln debug map", d.path);
  const json& ins = j.at("instructions");
  if (o.method != j.value("method", "forward") || ins.size() != m.num_instructions()) {
    d.note = fmt::format("the debug map {} describes another program ({} instructions, this method has {}); "
                         "it is not used",
                         d.path, ins.size(), m.num_instructions());
    return d;
  }
  d.nodes = j.at("nodes");
  for (const json& e : ins) {
    d.instruction_handle.push_back(e.value("debug_handle", int64_t{-1}));
    d.instruction_region.push_back(e.value("region", int64_t{-1}));
  }
  d.present = true;
  return d;
}

// The deepest module that holds every one of `paths` ("a.b.c", "a.b.d" -> "a.b").
std::string common_module(const std::vector<std::string>& paths) {
  if (paths.empty()) return {};
  std::string common = paths[0];
  for (const std::string& p : paths) {
    size_t k = 0, last_dot = 0;
    while (k < common.size() && k < p.size() && common[k] == p[k]) {
      if (common[k] == '.') last_dot = k;
      ++k;
    }
    const bool whole = (k == common.size() && (k == p.size() || p[k] == '.')) ||
                       (k == p.size() && (k == common.size() || common[k] == '.'));
    common = whole ? common.substr(0, k) : common.substr(0, last_dot);
  }
  return common;
}

// "model.transformer.h.3.attn" -> "model.transformer.h.*.attn": every layer's copy of a module together.
std::string module_pattern(const std::string& path) {
  std::string out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    out += digits ? "*" : part;
    if (dot == std::string::npos) break;
    out += '.';
    start = dot + 1;
  }
  return out;
}

void describe(Item& it, const DebugMap& map) {
  if (!map.present) {
    it.op = it.label;
    return;
  }
  std::vector<std::string> modules;
  std::vector<std::string> ops;
  for (uint32_t h : it.debug_handles) {
    if (h >= map.nodes.size()) continue;
    const json& n = map.nodes[h];
    modules.push_back(n.value("module_path", ""));
    std::string t = n.value("target", "");
    if (std::find(ops.begin(), ops.end(), t) == ops.end()) ops.push_back(t);
    if (it.source.empty() && n.contains("source") && n["source"].is_object()) it.source = n["source"].value("location", "");
  }
  it.module = common_module(modules);
  if (it.kind == Item::Kind::Instruction) {
    it.op = it.label;
  } else if (it.kind == Item::Kind::Overhead) {
    it.op = "delegate call (outside its steps)";
  } else {
    it.op = ops.empty() ? it.label : fmt::format("{}", fmt::join(ops, " + "));
  }
  if (it.module.empty()) it.module = "(program)";
}

int run_profile(const ProfileOptions& o) {
  check(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  check(!o.debug_outputs || !o.etdump.empty(), "--debug-outputs needs --etdump (the outputs go into the ETDump's debug buffer)");
  check(o.debug_buffer.empty() || o.debug_outputs, "--debug-buffer needs --debug-outputs");
  check(o.debug_buffer_mb >= 1 && o.debug_buffer_mb <= (int64_t{1} << 20), "--debug-buffer-mb must be 1 to 1048576");
  check_threads(o.threads);
  auto program = load_program(o);
  auto method = load_method(program.value(), o, /*profiling_detail=*/true);  // XNNPACK's nodes each timed
  rt::ErrorMessage err;
  rt::Method& m = method.value();

  // An LLM program (constant method use_kv_cache = true): forward(tokens[1, T], input_pos) keeps a
  // KV cache; each run is a step at the next positions (T = 1: a decode step).
  bool llm = false;
  if (auto kv = program->load_method("use_kv_cache", &err); kv.ok() && kv->num_outputs() == 1) {
    const rt::EValue& v = kv->output_value(0);
    llm = v.tag == rt::EValue::Tag::Bool && v.scalar.b;
  }
  int64_t max_seq_len = 0;  // the cache's positions: get_max_context_len, else get_max_seq_len (llm::Metadata)
  for (const char* name : {"get_max_seq_len", "get_max_context_len"})
    if (auto ms = program->load_method(name, &err); ms.ok() && ms->num_outputs() == 1 &&
                                                    ms->output_value(0).tag == rt::EValue::Tag::Int)
      max_seq_len = ms->output_value(0).scalar.i;

  MethodInputs in = method_inputs(m, o.inputs, o.file);
  auto& inputs = in.data;
  int64_t step_tokens = 0;
  std::string phase = "forward";
  const bool llm_steps = llm && m.num_inputs() == 2 && m.input(1).dtype == ScalarType::Long && o.inputs.empty();
  check(o.tokens == 0 || (llm_steps && m.input_is_dynamic(0) && m.input_is_dynamic(1)),
        "{}: --tokens needs an LLM program whose token count is dynamic (python -m kiln_export llm --dynamic)", o.file);
  if (llm_steps) {
    step_tokens = m.input(0).numel;
    check(o.tokens <= step_tokens, "--tokens {}: the program takes at most {} per call", o.tokens, step_tokens);
    if (o.tokens > 0) step_tokens = o.tokens;
    phase = step_tokens == 1 ? "decode" : "prefill";
  }
  int64_t pos = 0;
  std::vector<int64_t> run_positions;  // LLM steps: each profiled run's first position
  auto set_inputs = [&] {
    if (step_tokens > 0) {  // the next positions (wrapping before the cache's end)
      if (max_seq_len > 0 && pos + step_tokens > max_seq_len) pos = 0;
      std::vector<int64_t> p(static_cast<size_t>(step_tokens));
      for (size_t k = 0; k < p.size(); ++k) p[k] = pos + static_cast<int64_t>(k);
      std::memcpy(inputs[1].data(), p.data(), p.size() * sizeof(int64_t));
      pos += step_tokens;
      if (o.tokens > 0) {  // a dynamic program: tokens [1, T], positions [T]
        const int64_t tok_shape[2] = {1, step_tokens}, pos_shape[1] = {step_tokens};
        if (m.set_input(0, inputs[0].data(), static_cast<size_t>(step_tokens) * sizeof(int64_t), tok_shape, &err) !=
                rt::Status::Ok ||
            m.set_input(1, inputs[1].data(), static_cast<size_t>(step_tokens) * sizeof(int64_t), pos_shape, &err) !=
                rt::Status::Ok)
          fail("inputs: {}", err.c_str());
        return;
      }
    }
    set_method_inputs(m, in);
  };
  auto execute = [&] {
    if (m.execute(&err) != rt::Status::Ok) fail("{}: execution failed: {}", o.file, err.c_str());
  };
  for (int i = 0; i < o.warmup; ++i) {
    set_inputs();
    execute();
  }

  const DebugMap map = load_debug_map(o, m);
  // What each delegate's steps are (labels, debug handles); their buffers sized once.
  std::vector<std::vector<rt::BackendStepProfile>> steps(m.num_delegates());
  for (size_t d = 0; d < m.num_delegates(); ++d) {
    size_t n = m.delegate_steps(d, {});
    steps[d].resize(n);
    m.delegate_steps(d, steps[d]);
  }

  // Runs, each timed around execute(); after each, the events it recorded.
  struct Event {
    std::string name, cat;
    uint64_t start_ns, end_ns;
    size_t item;
    size_t run;
  };
  std::vector<Event> events;
  std::vector<Item> items;
  std::vector<size_t> item_of_instruction(m.num_instructions(), SIZE_MAX);
  std::vector<std::vector<size_t>> item_of_step(m.num_delegates());
  for (size_t i = 0; i < m.num_instructions(); ++i) {
    Item it;
    it.instruction = i;
    it.label = m.instruction_label(i);
    if (map.present && map.instruction_handle[i] >= 0) it.debug_handles = {static_cast<uint32_t>(map.instruction_handle[i])};
    const int d = m.instruction_delegate(i);
    if (d >= 0 && !steps[static_cast<size_t>(d)].empty()) {
      it.kind = Item::Kind::Overhead;
      it.label = fmt::format("{} call overhead", m.instruction_label(i));
      for (size_t k = 0; k < steps[static_cast<size_t>(d)].size(); ++k) {
        const auto& s = steps[static_cast<size_t>(d)][k];
        Item st;
        st.kind = Item::Kind::Step;
        st.instruction = i;
        st.step = k;
        st.label = s.label ? s.label : "step";
        st.debug_handles.assign(s.debug_handles, s.debug_handles + s.num_debug_handles);
        st.region = map.present ? map.instruction_region[i] : d;
        item_of_step[static_cast<size_t>(d)].push_back(items.size());
        items.push_back(std::move(st));
      }
      // the call overhead belongs to the region as a whole
      if (map.present)
        for (const auto& s : steps[static_cast<size_t>(d)]) it.debug_handles.insert(it.debug_handles.end(), s.debug_handles, s.debug_handles + s.num_debug_handles);
    }
    if (d >= 0) it.region = map.present ? map.instruction_region[i] : d;
    item_of_instruction[i] = items.size();
    items.push_back(std::move(it));
  }
  for (Item& it : items) describe(it, map);

  // Intermediate outputs: the first profiled run's (later runs would repeat or, with state, differ).
  std::unique_ptr<rt::DebugOutputLog> debug_log;
  if (o.debug_outputs) {
    debug_log = std::make_unique<rt::DebugOutputLog>(static_cast<size_t>(o.debug_buffer_mb) << 20, size_t{1} << 16);
    check(debug_log->data() != nullptr, "--debug-buffer-mb {}: out of memory", o.debug_buffer_mb);
  }
  m.enable_profiling(true);
  std::vector<double> wall_ms;
  std::vector<uint64_t> seen(m.num_instructions(), 0);
  std::vector<std::vector<uint64_t>> seen_step(m.num_delegates());
  for (size_t d = 0; d < m.num_delegates(); ++d) seen_step[d].assign(steps[d].size(), 0);
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // execute's start, end
  uint64_t measured_ns = 0;
  for (int r = 0; r < o.iters; ++r) {
    set_inputs();
    if (debug_log && r == 0) m.enable_debug_outputs(debug_log.get());
    if (step_tokens > 0) run_positions.push_back(pos - step_tokens);
    const auto a = Clock::now();
    execute();
    const auto b = Clock::now();
    if (debug_log && r == 0) m.enable_debug_outputs(nullptr);
    const auto ns = [](Clock::time_point t) {
      return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
    };
    runs.emplace_back(ns(a), ns(b));
    measured_ns += ns(b) - ns(a);
    wall_ms.push_back(static_cast<double>(ns(b) - ns(a)) / 1e6);
    const auto prof = m.profile();
    for (size_t i = 0; i < m.num_instructions(); ++i) {
      if (prof[i].calls == seen[i]) continue;  // not run this time
      seen[i] = prof[i].calls;
      const int d = m.instruction_delegate(i);
      events.push_back({m.instruction_label(i), d >= 0 ? "delegate" : "kernel", prof[i].last_start_ns,
                        prof[i].last_end_ns, item_of_instruction[i], static_cast<size_t>(r)});
      if (d < 0 || steps[static_cast<size_t>(d)].empty()) continue;
      auto& buf = steps[static_cast<size_t>(d)];
      m.delegate_steps(static_cast<size_t>(d), buf);
      for (size_t k = 0; k < buf.size(); ++k) {
        if (buf[k].calls == seen_step[static_cast<size_t>(d)][k]) continue;
        seen_step[static_cast<size_t>(d)][k] = buf[k].calls;
        const size_t item = item_of_step[static_cast<size_t>(d)][k];
        events.push_back({items[item].label, "step", buf[k].last_start_ns, buf[k].last_end_ns, item, static_cast<size_t>(r)});
      }
    }
  }
  // Totals: kernel calls as timed; a delegate call as its steps plus the rest of its time.
  // Read while profiling is on: enable_profiling (on or off) starts the counters from zero.
  for (size_t d = 0; d < m.num_delegates(); ++d) m.delegate_steps(d, steps[d]);
  const std::vector<rt::InstructionProfile> prof(m.profile().begin(), m.profile().end());
  m.enable_profiling(false);
  uint64_t profiled_ns = 0;
  for (size_t i = 0; i < m.num_instructions(); ++i) {
    Item& it = items[item_of_instruction[i]];
    it.calls = prof[i].calls;
    uint64_t ns = prof[i].total_ns;
    profiled_ns += ns;
    const int d = m.instruction_delegate(i);
    if (d >= 0)
      for (size_t k = 0; k < steps[static_cast<size_t>(d)].size(); ++k) {
        Item& st = items[item_of_step[static_cast<size_t>(d)][k]];
        st.calls = steps[static_cast<size_t>(d)][k].calls;
        st.ns = steps[static_cast<size_t>(d)][k].total_ns;
        st.positions_read = steps[static_cast<size_t>(d)][k].positions_read;
        st.cache_positions = steps[static_cast<size_t>(d)][k].cache_positions;
        ns -= std::min(ns, st.ns);
      }
    it.ns = ns;
  }

  const double per_run = 1.0 / (1e6 * o.iters);  // ns summed over the runs -> ms per run
  const double measured = static_cast<double>(measured_ns);
  auto share = [&](uint64_t ns) { return measured > 0 ? static_cast<double>(ns) / measured : 0.0; };
  struct Group {
    uint64_t ns = 0, calls = 0;
    int64_t items = 0;
  };
  using Table = std::map<std::string, Group>;
  Table by_op, by_module, by_pattern, by_region;
  for (const Item& it : items) {
    if (it.calls == 0 && it.ns == 0) continue;
    auto add = [&](Table& t, const std::string& key) {
      Group& g = t[key];
      g.ns += it.ns;
      g.calls += it.calls;
      g.items++;
    };
    add(by_op, it.op);
    if (map.present) {
      add(by_module, it.module);
      add(by_pattern, module_pattern(it.module));
    }
    add(by_region, it.region >= 0 ? fmt::format("region {}", it.region) : "portable kernels (outside delegates)");
  }
  auto sorted = [](const Table& t) {
    std::vector<std::pair<std::string, Group>> rows(t.begin(), t.end());
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    return rows;
  };
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a].ns > items[b].ns; });
  std::vector<double> sorted_wall = wall_ms;
  std::sort(sorted_wall.begin(), sorted_wall.end());
  const double median = sorted_wall.size() % 2 ? sorted_wall[sorted_wall.size() / 2]
                                               : 0.5 * (sorted_wall[sorted_wall.size() / 2 - 1] + sorted_wall[sorted_wall.size() / 2]);
  size_t num_steps = 0;
  for (const auto& s : steps) num_steps += s.size();

  std::unique_ptr<StagedFile> trace_file, etdump_file, debug_file;
  const std::string debug_buffer_path =
      !o.debug_buffer.empty() ? o.debug_buffer : fs::path(o.etdump).replace_extension(".debug.bin").string();
  if (!o.trace.empty()) {  // Chrome trace (the JSON array form with metadata), µs from the first run's start
    const uint64_t t0 = runs.empty() ? 0 : runs.front().first;
    auto us = [&](uint64_t ns) { return static_cast<double>(ns - std::min(ns, t0)) / 1e3; };
    json ev = json::array();
    ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"tid", 1}, {"args", {{"name", fmt::format("kiln profile {}", fs::path(o.file).filename().string())}}}});
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", 1}, {"args", {{"name", "execute (calling thread)"}}}});
    for (size_t r = 0; r < runs.size(); ++r)
      ev.push_back({{"ph", "X"}, {"cat", "run"}, {"name", fmt::format("{} run {}", phase, r)}, {"pid", 1}, {"tid", 1},
                    {"ts", us(runs[r].first)}, {"dur", static_cast<double>(runs[r].second - runs[r].first) / 1e3}});
    for (const Event& e : events) {
      const Item& it = items[e.item];
      json args = {{"instruction", it.instruction}, {"op", it.op}};
      if (e.cat == "step") args["step"] = it.step;
      if (it.region >= 0) args["region"] = it.region;
      if (map.present) {
        args["module"] = it.module;
        if (!it.source.empty()) args["source"] = it.source;
        args["debug_handles"] = it.debug_handles;
      }
      ev.push_back({{"ph", "X"}, {"cat", e.cat}, {"name", e.name}, {"pid", 1}, {"tid", 1}, {"ts", us(e.start_ns)},
                    {"dur", static_cast<double>(e.end_ns - std::min(e.end_ns, e.start_ns)) / 1e3}, {"args", args}});
    }
    json trace = {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
    const std::string text = trace.dump() + "\n";
    trace_file = std::make_unique<StagedFile>(o.trace);
    trace_file->write(text);
  }

  if (!o.etdump.empty()) {  // ETDump: one RunData per profiled run, times in ns from the first run's start
    const uint64_t t0 = runs.empty() ? 0 : runs.front().first;
    std::vector<EtdumpRun> er(runs.size());
    for (size_t r = 0; r < runs.size(); ++r) {
      er[r].name = o.method;
      er[r].events.push_back({"Method::execute", -1, -1, "", runs[r].first - t0, runs[r].second - t0});
    }
    std::map<std::pair<size_t, uint32_t>, size_t> step_event;  // run 0: (instruction, step's last node) -> event
    // A step whose output later views reshape (no step of their own): when the debug map says the last
    // view lowers the same .pt2 node as the step's last node (matmul: bmm then view), the step is named
    // by the view too (its "<k>" last: the ETRecord names the operator by it) and its output has the
    // view's sizes, the operator's.
    std::map<std::pair<size_t, uint32_t>, const rt::DebugOutput*> named_by_view;
    if (debug_log && map.present)
      for (const rt::DebugOutput& d : debug_log->entries()) {
        if (d.delegate_node < 0 || d.view_node < 0) continue;
        const auto a = static_cast<size_t>(d.delegate_node), b = static_cast<size_t>(d.view_node);
        if (a >= map.nodes.size() || b >= map.nodes.size() || !map.nodes[a].is_object() || !map.nodes[b].is_object())
          continue;
        const json& sa = map.nodes[a].value("source_nodes", json::array());
        if (!sa.empty() && sa == map.nodes[b].value("source_nodes", json::array()))
          named_by_view.emplace(std::make_pair(static_cast<size_t>(d.instruction), static_cast<uint32_t>(d.delegate_node)), &d);
      }
    for (const Event& e : events) {
      const Item& it = items[e.item];
      if (e.run == 0 && e.cat == "step" && !it.debug_handles.empty())
        step_event.emplace(std::make_pair(it.instruction, it.debug_handles.back()), er[0].events.size());
      EtdumpEvent x;
      x.instruction_id = static_cast<int32_t>(it.instruction);
      x.start_ns = e.start_ns - std::min(e.start_ns, t0);
      x.end_ns = e.end_ns - std::min(e.end_ns, t0);
      if (e.cat == "step") {  // a delegated event: Inspector names it by its identifier
        x.name = it.label;
        // then "<k>" per payload node it runs: the keys an ETRecord's delegate map names them by
        std::string keys;
        for (uint32_t h : it.debug_handles) keys += fmt::format("<{}>", h);
        if (!it.debug_handles.empty())
          if (auto v = named_by_view.find({it.instruction, it.debug_handles.back()}); v != named_by_view.end())
            keys += fmt::format("<{}>", v->second->view_node);
        x.delegate_id_str = map.present ? fmt::format("{}: {} (#{}.{}) {}", it.module, it.label, it.instruction, it.step, keys)
                                        : fmt::format("{} (#{}.{}) {}", it.label, it.instruction, it.step, keys);
      } else if (e.cat == "delegate") {
        x.name = "DELEGATE_CALL";
      } else {
        x.name = map.present ? fmt::format("{} ({})", it.label, it.module) : it.label;
      }
      er[e.run].events.push_back(std::move(x));
    }
    if (debug_log && !er.empty()) {  // each logged tensor before its instruction's first event of run 0
      std::vector<size_t> first(m.num_instructions(), er[0].events.size());
      for (size_t k = er[0].events.size(); k-- > 1;)
        if (er[0].events[k].instruction_id >= 0) first[static_cast<size_t>(er[0].events[k].instruction_id)] = k;
      for (const rt::DebugOutput& d : debug_log->entries()) {
        size_t at = first[d.instruction];
        std::string id;  // a node inside a delegate (its step's output): the step's identifier, before its event
        if (d.delegate_node >= 0) {
          const auto f = step_event.find({d.instruction, static_cast<uint32_t>(d.delegate_node)});
          if (f != step_event.end()) at = f->second;
          id = f != step_event.end() ? er[0].events[at].delegate_id_str : fmt::format("<{}>", d.delegate_node);
        }
        const bool by_view =
            d.delegate_node >= 0 && named_by_view.count({d.instruction, static_cast<uint32_t>(d.delegate_node)}) > 0;
        std::vector<int64_t> sizes = by_view ? std::vector<int64_t>(d.view_sizes, d.view_sizes + d.view_dim)
                                             : std::vector<int64_t>(d.sizes, d.sizes + d.dim);
        er[0].debug.push_back({at, {static_cast<int32_t>(d.instruction), d.dtype, std::move(sizes), d.offset, std::move(id)}});
      }
      std::stable_sort(er[0].debug.begin(), er[0].debug.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      debug_file = std::make_unique<StagedFile>(debug_buffer_path);
      debug_file->write(debug_log->data(), debug_log->bytes_used());
    }
    const std::vector<uint8_t> bytes = etdump_bytes(er);
    etdump_file = std::make_unique<StagedFile>(o.etdump);
    etdump_file->write(bytes.data(), bytes.size());
  }
  {  // --trace and --etdump are published together, or neither (kiln/core/output_file.h)
    std::vector<StagedFile*> files;
    if (trace_file) files.push_back(trace_file.get());
    if (debug_file) files.push_back(debug_file.get());
    if (etdump_file) files.push_back(etdump_file.get());
    publish_together(files);
  }

  if (o.as_json) {
    auto table = [&](const Table& t, const char* key) {
      json a = json::array();
      for (const auto& [name, g] : sorted(t))
        a.push_back({{key, name}, {"ms_per_run", static_cast<double>(g.ns) * per_run}, {"share", share(g.ns)},
                     {"calls_per_run", static_cast<double>(g.calls) / o.iters}, {"rows", g.items}});
      return a;
    };
    json rows = json::array();
    for (size_t k : order) {
      const Item& it = items[k];
      json r = {{"kind", it.kind == Item::Kind::Step ? "step" : it.kind == Item::Kind::Overhead ? "delegate_overhead" : "instruction"},
                {"label", it.label}, {"op", it.op}, {"instruction", it.instruction},
                {"ms_per_run", static_cast<double>(it.ns) * per_run}, {"share", share(it.ns)},
                {"calls_per_run", static_cast<double>(it.calls) / o.iters}, {"debug_handles", it.debug_handles}};
      if (it.kind == Item::Kind::Step) r["step"] = it.step;
      if (it.positions_read >= 0) {
        r["positions_read"] = it.positions_read;
        r["cache_positions"] = it.cache_positions;
      }
      if (it.region >= 0) r["region"] = it.region;
      if (map.present) {
        r["module"] = it.module;
        r["source"] = it.source;
      }
      rows.push_back(std::move(r));
    }
    json j = {{"file", o.file}, {"method", o.method}, {"phase", phase}, {"iters", o.iters}, {"threads", o.threads},
              {"engine", o.engine}, {"instructions", m.num_instructions()}, {"delegates", m.num_delegates()},
              {"delegate_steps", num_steps},
              {"debug_map", map.present ? json(map.path) : json(nullptr)}, {"note", map.note},
              {"measured_ms_per_run", measured * per_run}, {"median_ms", median}, {"times_ms", wall_ms},
              {"profiled_ms_per_run", static_cast<double>(profiled_ns) * per_run},
              {"rows", rows}, {"by_operator", table(by_op, "operator")}, {"by_region", table(by_region, "region")},
              {"trace", o.trace.empty() ? json(nullptr) : json(o.trace)}, {"trace_events", events.size()},
              {"etdump", o.etdump.empty() ? json(nullptr) : json(o.etdump)}};
    if (debug_log)
      j["debug_outputs"] = {{"buffer", debug_buffer_path}, {"tensors", debug_log->entries().size()},
                            {"bytes", debug_log->bytes_used()}, {"overflowed", debug_log->overflowed()}};
    if (step_tokens > 0) j["step_positions"] = run_positions;
    if (map.present) {
      j["by_module"] = table(by_module, "module");
      j["by_module_pattern"] = table(by_pattern, "module");
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }

  fmt::print("{}: {} instructions, {} delegate call(s) with {} step(s), {} thread(s), {} runs ({})\n", o.file,
             m.num_instructions(), m.num_delegates(), num_steps, o.threads, o.iters,
             step_tokens ? fmt::format("{} steps of {} token(s)", phase, step_tokens) : phase);
  fmt::print("  execute: {:.3f} ms per run (wall time around execute(), median {:.3f} ms); the rows below cover {:.1f}% of it\n",
             measured * per_run, median, 100.0 * share(profiled_ns));
  if (!map.note.empty()) fmt::print("  note: {}\n", map.note);
  auto print_table = [&](const char* title, const Table& t) {
    fmt::print("  by {}:\n", title);
    int n = 0;
    for (const auto& [name, g] : sorted(t)) {
      if (n++ == o.top) break;
      fmt::print("    {:>9.3f} ms {:5.1f}%  {:>5} calls  {}\n", static_cast<double>(g.ns) * per_run, 100.0 * share(g.ns),
                 g.calls / static_cast<uint64_t>(o.iters), name);
    }
  };
  if (map.present) {
    print_table("module", by_module);
    print_table("module, every layer together", by_pattern);
  }
  print_table("operator", by_op);
  print_table("delegate region", by_region);
  fmt::print("  slowest steps:\n");
  for (size_t k = 0; k < order.size() && static_cast<int>(k) < o.top; ++k) {
    const Item& it = items[order[k]];
    fmt::print("    {:>9.3f} ms {:5.1f}%  #{}{}  {}{}{}\n", static_cast<double>(it.ns) * per_run, 100.0 * share(it.ns),
               it.instruction, it.kind == Item::Kind::Step ? fmt::format(".{}", it.step) : std::string(), it.label,
               it.module.empty() ? "" : "  " + it.module, it.source.empty() ? "" : "  (" + it.source + ")");
  }
  // Attention over a KV cache: the positions its steps read in the last run, per module (a layer's
  // scores and its product with V read the same ones)
  std::vector<std::pair<std::string, const Item*>> attention;
  for (const Item& it : items) {
    if (it.positions_read < 0) continue;
    const std::string where = it.module.empty() ? fmt::format("#{}.{} {}", it.instruction, it.step, it.label) : it.module;
    auto same = std::find_if(attention.begin(), attention.end(), [&](const auto& a) { return a.first == where; });
    if (same == attention.end()) attention.emplace_back(where, &it);
    else if (it.positions_read > same->second->positions_read) same->second = &it;
  }
  if (!attention.empty()) {
    fmt::print("  attention over the KV cache, positions read in the last run:\n");
    for (const auto& [where, it] : attention)
      fmt::print("    {:>6} of {:<6} {}\n", it->positions_read, it->cache_positions, where);
  }
  if (!o.trace.empty()) fmt::print("  trace: {} ({} events)\n", o.trace, events.size());
  if (!o.etdump.empty()) fmt::print("  etdump: {}\n", o.etdump);
  if (debug_log)
    fmt::print("  debug outputs: {} tensors, {:.1f} MB in {}{}\n", debug_log->entries().size(),
               static_cast<double>(debug_log->bytes_used()) / 1e6, debug_buffer_path,
               debug_log->overflowed() ? " (the buffer filled up: later outputs were not logged; raise --debug-buffer-mb)" : "");
  return 0;
}

}  // namespace

void add_profile_options(CLI::App* cmd, std::function<int()>& run) {
  auto opts = bind_action(cmd, run, run_profile);
  cmd->add_option("file", opts->file, "the .pte program (its debug map X.debug.json beside it names the model's modules)")
      ->required()->check(CLI::ExistingFile);
  cmd->add_option("--input,-i", opts->inputs, "input tensors (.npy), one per method input (default: zeros; LLM programs: "
                                             "tokens 0 at successive positions)");
  cmd->add_option("--iters", opts->iters, "profiled runs")->capture_default_str();
  cmd->add_option("--warmup", opts->warmup, "runs before profiling")->capture_default_str();
  cmd->add_option("--tokens", opts->tokens, "LLM programs with a dynamic token count: tokens per profiled step "
                                            "(1: decode steps; default: the most the program takes)");
  cmd->add_option("--threads", opts->threads, "threads of the XNNPACK backend's pool")->capture_default_str();
  cmd->add_option("--engine", opts->engine, "kiln or xnnpack (as kiln bench)")
      ->check(CLI::IsMember({"kiln", "xnnpack"}))->capture_default_str();
  cmd->add_option("--method", opts->method, "method to run")->capture_default_str();
  cmd->add_option("--trace", opts->trace, "write a Chrome-trace JSON (chrome://tracing, ui.perfetto.dev): one event per run, "
                                         "instruction and delegate step");
  cmd->add_option("--etdump", opts->etdump, "write an ETDump (ExecuTorch's event format, executorch.devtools.Inspector "
                                           "reads it): per run, Method::execute, every instruction, every delegate step");
  cmd->add_flag("--debug-outputs", opts->debug_outputs,
                "with --etdump: log the first profiled run's intermediate outputs (every instruction's outputs, as "
                "ExecuTorch's runtime logs them) into the ETDump's debug buffer, for Inspector.calculate_numeric_gap");
  cmd->add_option("--debug-buffer", opts->debug_buffer, "where the debug buffer goes (default: the ETDump's path with "
                                                       ".debug.bin; Inspector's debug_buffer_path)");
  cmd->add_option("--debug-buffer-mb", opts->debug_buffer_mb, "the most MB of outputs logged (the rest are not)")
      ->capture_default_str();
  cmd->add_option("--debug-map", opts->debug_map, "the debug map (default: X.debug.json beside X.pte)");
  cmd->add_option("--top", opts->top, "rows per table")->capture_default_str();
  cmd->add_flag("--json", opts->as_json, "print JSON (rows, by_operator, by_module, by_module_pattern, by_region, "
                                        "measured_ms_per_run, ...)");
}

}  // namespace kiln::cli
