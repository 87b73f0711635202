// Output sizes of opdev's operators, computed before the vendor kernel is called (the vendor
// writes into tensors it is given and never allocates).
#pragma once

#include <ATen/Tensor.h>
#include <c10/util/SmallVector.h>

namespace opdev::output_size {

// The broadcast of two operands' sizes.
c10::SmallVector<int64_t, 8> broadcast(const at::Tensor& self, const at::Tensor& other);

} // namespace opdev::output_size
