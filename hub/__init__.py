"""gpufleet: one trusted view of every GPU across many Kubernetes clusters."""

__version__ = "0.1.0"
