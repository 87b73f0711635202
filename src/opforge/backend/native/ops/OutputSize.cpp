#include "ops/OutputSize.h"

#include <ATen/ExpandUtils.h>

namespace opdev::output_size {

c10::SmallVector<int64_t, 8> broadcast(const at::Tensor& self, const at::Tensor& other) {
  auto sizes = at::infer_size_dimvector(self.sizes(), other.sizes());
  return c10::SmallVector<int64_t, 8>(sizes.begin(), sizes.end());
}

} // namespace opdev::output_size
