"""Datasets, one module and one `bench.data.Dataset` subclass each (installed as `bench.datasets`)."""
