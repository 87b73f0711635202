// vk: opdev's vendor kernel library, the analogue of a vendor operator library such as aclnn.
// A C interface over plain descriptors: one entry point per kernel (declared in the generated
// vk_kernels.h), a status code per call and a message for the last failure. Backends adapt
// PyTorch operators onto it; it knows nothing of PyTorch's dispatcher.
#pragma once

#include <cstdint>

extern "C" {

typedef int32_t vkStatus;
#define VK_SUCCESS 0
#define VK_ERROR_INVALID_PARAM 161001
#define VK_ERROR_UNSUPPORTED_DTYPE 161002
#define VK_ERROR_INNER 561000

typedef enum {
  VK_DT_FLOAT = 0,
  VK_DT_FLOAT16 = 1,
  VK_DT_BFLOAT16 = 2,
  VK_DT_DOUBLE = 3,
  VK_DT_INT8 = 4,
  VK_DT_UINT8 = 5,
  VK_DT_INT16 = 6,
  VK_DT_INT32 = 7,
  VK_DT_INT64 = 8,
  VK_DT_BOOL = 9,
  VK_DT_COMPLEX64 = 10,
  VK_DT_COMPLEX128 = 11,
} vkDataType;

// A strided view of device memory; `data` already includes the view's offset.
typedef struct {
  void* data;
  int32_t dtype; // vkDataType
  int32_t ndim;
  const int64_t* sizes;
  const int64_t* strides; // in elements
} vkTensor;

typedef enum { VK_SCALAR_DOUBLE = 0, VK_SCALAR_INT = 1, VK_SCALAR_BOOL = 2 } vkScalarKind;

typedef struct {
  int32_t kind; // vkScalarKind
  double f;
  int64_t i;
} vkScalar;

typedef struct {
  const int64_t* data;
  int64_t len;
} vkIntArray;

// The message of the last failed call on this thread ("" when none failed).
const char* vkGetLastErrorMessage(void);

} // extern "C"
