// aten::eq on opdev: each overload's kernel follows its CHECKLIST (adaptations/).
#include "ops/OpApi.h"
#include "ops/OutputSize.h"

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

// aten::eq.Tensor: from adaptations/eq.Tensor/CHECKLIST.md (dtypes, checks, output, vendor kernel)
at::Tensor OpdevNativeFunctions::eq(const at::Tensor & self, const at::Tensor & other) {
  TORCH_CHECK(op_api::dtype_in(self, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort, at::kInt, at::kLong, at::kBool}), "eq: self must have dtype in [float32 float64 float16 bfloat16 int8 uint8 int16 int32 int64 bool] on opdev");
  TORCH_CHECK(op_api::dtype_in(other, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort, at::kInt, at::kLong, at::kBool}), "eq: other must have dtype in [float32 float64 float16 bfloat16 int8 uint8 int16 int32 int64 bool] on opdev");
  TORCH_CHECK(output_size::broadcastable({self, other}), "eq: the shapes of self, other cannot be broadcast together");
  at::Tensor out = op_api::empty(output_size::broadcast({self, other}), at::kBool, self);
  EXEC_OPDEV_CMD(vkEq, self, other, out);
  return out;
}

} // namespace opdev
