"""The results folder."""
