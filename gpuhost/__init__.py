"""gpuhost: turn bare GPU servers into VFIO passthrough hosts and prove the guests get the GPU."""

__version__ = "0.1.0"
