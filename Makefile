# The two commands: `make demo` runs the demo grid, `make test` runs the tests. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RESULTS ?= results/demo

.PHONY: demo test install lint clean

# The tested versions (constraints.txt) of the compatible ranges in pyproject.toml; the UI extra for `bench ui`;
# the probe extra (timm) for the DINOv2, CLIP and Inception-ResNet-v2 tests.
$(BIN)/bench: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,ui,probe]'
	touch $(BIN)/bench

install: $(BIN)/bench

# The demo needs Fashion-MNIST: fetched (md5-checked) into the data root when missing, kept when present.
demo: $(BIN)/bench
	$(BIN)/bench datasets --download fashion_mnist
	$(BIN)/bench run tune_configs/demo.yaml --results $(RESULTS)
	$(BIN)/bench report $(RESULTS)

test: $(BIN)/bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q

lint: $(BIN)/bench
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache
