"""opforge: verified, fused Triton operators for PyTorch accelerators."""

__version__ = "0.1.0"
