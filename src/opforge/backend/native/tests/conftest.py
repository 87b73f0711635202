"""Registers opdev before any test module imports torch.testing, whose device-type tests list the
backends available when it is first imported."""
import opforge.backend.device  # noqa: F401
