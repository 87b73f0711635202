// aten::sgn on opdev: each overload's kernel follows its CHECKLIST (adaptations/).
#include "ops/OpApi.h"
#include "ops/OutputSize.h"

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

// aten::sgn: from adaptations/sgn/CHECKLIST.md (dtypes, checks, output, vendor kernel)
at::Tensor OpdevNativeFunctions::sgn(const at::Tensor & self) {
  TORCH_CHECK(op_api::dtype_in(self, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort, at::kInt, at::kLong}), "sgn: self must have dtype in [float32 float64 float16 bfloat16 int8 uint8 int16 int32 int64] on opdev");
  at::Tensor out = op_api::empty(self.sizes(), op_api::result_type({self}), self);
  EXEC_OPDEV_CMD(vkSgn, self, out);
  return out;
}

} // namespace opdev
