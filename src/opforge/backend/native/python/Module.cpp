// The Python side of the runtime: what torch.opdev needs and nothing more. Operators reach
// Python through the dispatcher, not through this module.
#include "runtime/OpdevRuntime.h"

#include <ATen/Context.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "opdev runtime: devices, memory statistics, default generators";
  m.def("device_count", [] { return static_cast<int>(opdev::device_count()); });
  m.def("current_device", [] { return static_cast<int>(opdev::current_device()); });
  m.def("set_device", [](int index) { opdev::set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("memory_stats", [](int index) {
    opdev::MemoryStats s = opdev::memory_stats(static_cast<c10::DeviceIndex>(index));
    py::dict d;
    d["allocated_bytes"] = s.allocated;
    d["peak_allocated_bytes"] = s.peak_allocated;
    d["allocations"] = s.allocations;
    return d;
  });
  m.def("default_generator", [](int index) {
    const at::Generator& gen = at::globalContext().defaultGenerator(
        c10::Device(opdev::kDeviceType, static_cast<c10::DeviceIndex>(index)));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
  });
  m.def("reset_peak_memory_stats", [](int index) {
    opdev::reset_peak_memory(static_cast<c10::DeviceIndex>(index));
  });
}
