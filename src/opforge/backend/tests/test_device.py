"""The opdev device behaves as a PrivateUse1 backend must: memory, copies, views, guard, generator, dispatch."""
import pytest
import torch

import opforge.backend.device as opdev

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool]


def sample(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    low = 0 if dtype == torch.uint8 else -20
    return torch.randint(low, 20, shape, generator=g, dtype=dtype)


def test_the_device_is_registered_under_its_name():
    assert torch._C._get_privateuse1_backend_name() == "opdev"
    assert torch.opdev is opdev
    assert torch.opdev.device_count() == 2
    x = torch.ones(2).opdev()
    assert x.is_opdev and x.device == torch.device("opdev", 0)
    m = torch.nn.Linear(2, 2).opdev()
    assert m.weight.device.type == "opdev"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copies_round_trip_every_dtype(dtype):
    x = sample((5, 7), dtype)
    assert torch.equal(x.to("opdev").cpu(), x)
    strided = x.t()  # a non-contiguous source keeps its values, not its bytes
    assert torch.equal(strided.to("opdev").cpu(), strided)


def test_copies_between_devices_and_dtypes():
    x = sample((4, 3), torch.float32)
    on1 = x.to("opdev:1")
    assert on1.device.index == 1
    back = on1.to("opdev:0").to(torch.float64)
    assert back.device.index == 0 and back.dtype == torch.float64
    torch.testing.assert_close(back.cpu(), x.double())


def test_views_alias_device_memory():
    x = torch.zeros(4, 6, device="opdev")
    row = x[1]
    row.fill_(3.0)
    col = x.t()[2]
    assert not x.t().is_contiguous()
    col.fill_(7.0)
    expected = torch.zeros(4, 6)
    expected[1] = 3.0
    expected[:, 2] = 7.0
    assert torch.equal(x.cpu(), expected)
    assert x.view(24).data_ptr() == x.data_ptr()
    assert torch.equal(x.as_strided((2, 2), (6, 1), 6).cpu(), expected.as_strided((2, 2), (6, 1), 6))


def test_empty_strided_and_resize_keep_layout_and_data():
    x = torch.empty_strided((3, 4), (1, 3), device="opdev")
    assert x.stride() == (1, 3)
    y = torch.arange(6, dtype=torch.float32).to("opdev")
    y.resize_(10)
    assert y.shape == (10,) and torch.equal(y[:6].cpu(), torch.arange(6, dtype=torch.float32))
    s = y.untyped_storage()
    s.resize_(80)  # goes through the hooks' resizePrivateUse1Bytes
    assert s.nbytes() == 80 and torch.equal(y[:6].cpu(), torch.arange(6, dtype=torch.float32))


def test_the_device_guard_chooses_where_tensors_live():
    assert torch.opdev.current_device() == 0
    torch.opdev.set_device(1)
    try:
        assert torch.empty(2, device="opdev").device.index == 1
    finally:
        torch.opdev.set_device(0)
    with pytest.raises(RuntimeError, match="invalid device index 5"):
        torch.opdev.set_device(5)


def test_memory_is_counted_per_device_and_freed():
    base = torch.opdev.memory_allocated(1)
    torch.opdev.reset_peak_memory_stats(1)
    x = torch.empty(1000, dtype=torch.float32, device="opdev:1")
    assert torch.opdev.memory_allocated(1) == base + 4000
    del x
    assert torch.opdev.memory_allocated(1) == base
    assert torch.opdev.max_memory_allocated(1) == base + 4000


def test_generators_belong_to_the_device_and_reseed():
    g = torch.Generator(device="opdev")
    assert g.device.type == "opdev"
    torch.opdev.manual_seed(1234)
    assert torch.opdev.initial_seed() == 1234
    state = torch.opdev.get_rng_state()
    torch.manual_seed(99)  # torch.manual_seed seeds every device's default generator too
    assert torch.opdev.initial_seed() == 99
    torch.opdev.set_rng_state(state)
    assert torch.equal(torch.opdev.get_rng_state(), state)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_and_mul_match_the_cpu(dtype):
    a, b = sample((3, 1, 5), dtype, 1), sample((4, 5), dtype, 2)
    alpha = True if dtype == torch.bool else 2
    assert torch.equal(torch.add(a.opdev(), b.opdev(), alpha=alpha).cpu(), torch.add(a, b, alpha=alpha))
    assert torch.equal((a.opdev() * b.opdev()).cpu(), a * b)


def test_in_place_out_and_cpu_scalar_forms_are_generated_from_the_functional_kernel():
    a, b = sample((4, 5), torch.float32, 1), sample((4, 5), torch.float32, 2)
    x = a.opdev()
    x.add_(b.opdev(), alpha=0.5)
    torch.testing.assert_close(x.cpu(), a + 0.5 * b)
    out = torch.empty(0, device="opdev")
    torch.mul(a.opdev(), b.opdev(), out=out)
    torch.testing.assert_close(out.cpu(), a * b)
    torch.testing.assert_close((a.opdev() * torch.tensor(3.0)).cpu(), a * 3.0)  # a CPU 0-dim operand


def test_a_dtype_the_vendor_lacks_fails_with_its_message():
    z = torch.ones(3, dtype=torch.complex64).opdev()
    with pytest.raises(RuntimeError, match=r"vkAdd failed with vendor status 161002: vkAdd: dtype ComplexFloat"):
        z + z


def test_an_operator_it_lacks_fails_with_the_dispatcher_error():
    with pytest.raises(NotImplementedError, match=r"Could not run 'aten::\w+(\.\w+)?' with arguments from the "
                                                   r"'opdev' backend"):
        torch.sin(torch.ones(3, device="opdev"))


def test_autograd_runs_through_the_autograd_key():
    a, b = sample((3, 4), torch.float32, 1), sample((3, 4), torch.float32, 2)
    x, y = a.opdev().requires_grad_(), b.opdev().requires_grad_()
    (x * y + x).backward(torch.ones(3, 4, device="opdev"))
    assert x.grad.device.type == "opdev"
    torch.testing.assert_close(x.grad.cpu(), b + 1)
    torch.testing.assert_close(y.grad.cpu(), a)


def test_item_reads_a_device_scalar():
    assert torch.tensor(2.5).opdev().item() == 2.5
