// aten::bitwise_or on opdev: each overload's kernel follows its CHECKLIST (adaptations/).
#include "ops/OpApi.h"
#include "ops/OutputSize.h"

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

// aten::bitwise_or.Tensor: from adaptations/bitwise_or.Tensor/CHECKLIST.md (dtypes, checks, output, vendor kernel)
at::Tensor OpdevNativeFunctions::bitwise_or(const at::Tensor & self, const at::Tensor & other) {
  TORCH_CHECK(op_api::dtype_in(self, {at::kChar, at::kByte, at::kShort, at::kInt, at::kLong, at::kBool}), "bitwise_or: self must have dtype in [int8 uint8 int16 int32 int64 bool] on opdev");
  TORCH_CHECK(op_api::dtype_in(other, {at::kChar, at::kByte, at::kShort, at::kInt, at::kLong, at::kBool}), "bitwise_or: other must have dtype in [int8 uint8 int16 int32 int64 bool] on opdev");
  TORCH_CHECK(output_size::broadcastable({self, other}), "bitwise_or: the shapes of self, other cannot be broadcast together");
  at::Tensor out = op_api::empty(output_size::broadcast({self, other}), op_api::result_type({self, other}), self);
  EXEC_OPDEV_CMD(vkBitwiseOr, self, other, out);
  return out;
}

} // namespace opdev
