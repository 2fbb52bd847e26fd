// Convert: fp32 rows to int8 rows quantized per row at run time (the 8da4w / 8da8w programs'
// activations), read by fully connected nodes with quantized weights. On kiln's code (run_quantize_rows).
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

static Status step(const StepContext& c, Step& step) {
  const Value& in = c.in(0);
  const Value& out = c.out();
  if (out.quant != Value::Quant::DynamicRows || in.quant != Value::Quant::None || in.numel != out.numel)
    return c.bad("kiln converts fp32 to dynamically quantized int8 rows only");
  step.kind = StepKind::QuantizeRows;
  step.label = "kiln quantize rows (int8, per row)";
  step.k = out.dims[out.ndims - 1];
  step.m = out.numel / step.k;
  step.rows_layout = out.rows_layout;
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(convert_nodes,
  {.type = NodeType::XNNConvert, .io = io_node1x1, .infer = infer_same, .kiln_step = step})

}  // namespace kiln::backends::xnnpack::detail
