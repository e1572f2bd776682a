"""The tests, one folder per package of bench (tests/README.md); a package, so that helpers import as tests.*."""
