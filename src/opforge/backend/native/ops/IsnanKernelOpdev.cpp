// aten::isnan on opdev. The vendor library has no isnan kernel; a NaN is the one value unequal to itself, so
// its `ne` kernel computes it (torch.testing's comparisons and opcheck call isnan on the device).
#include "ops/OpApi.h"

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

at::Tensor OpdevNativeFunctions::isnan(const at::Tensor& self) {
  at::Tensor out = op_api::empty(self.sizes(), at::kBool, self);
  EXEC_OPDEV_CMD(vkNe, self, self, out);
  return out;
}

} // namespace opdev
