"""Comparison methods, one module and one `bench.methods.Method` subclass each (installed as `bench.baselines`)."""
