"""bench: a benchmarking platform for learning with noisy labels, built around the L_DMI loss."""

__version__ = "0.1.0"
