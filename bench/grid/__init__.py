"""The driver."""
