// aten::abs on opdev: each overload's kernel follows its CHECKLIST (adaptations/).
#include "ops/OpApi.h"
#include "ops/OutputSize.h"

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

// aten::abs: from adaptations/abs/CHECKLIST.md (dtypes, checks, output, vendor kernel)
at::Tensor OpdevNativeFunctions::abs(const at::Tensor & self) {
  TORCH_CHECK(op_api::dtype_in(self, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort, at::kInt, at::kLong}), "abs: self must have dtype in [float32 float64 float16 bfloat16 int8 uint8 int16 int32 int64] on opdev");
  at::Tensor out = op_api::empty(self.sizes(), op_api::result_type({self}), self);
  EXEC_OPDEV_CMD(vkAbs, self, out);
  return out;
}

} // namespace opdev
