#!/usr/bin/env bash
# The wheels a GPU box without network needs for `bench run` and `bench report` (ray[tune], mlflow, polars,
# matplotlib and what they pull in), for CPython 3.12 on manylinux x86-64, packed as parts of under 60 MiB that can
# be carried one at a time:
#
#   benchmarks/carry_wheels.sh [DIR]        (default DIR: .whl, ignored by git; needs network and pip)
#
# It downloads into DIR/wheels (`pip download --only-binary :all:`), tars them, splits the tar into DIR/part-aa,
# DIR/part-ab, ... (59 MiB each) and writes DIR/MANIFEST (their sha256 sums); then removes DIR/wheels. Carry every
# DIR/part-* and DIR/MANIFEST to the GPU box's checkout (`run`'s carry: a part or two a call, they stay while the
# machine is warm); benchmarks/gpu_acceptance.sh checks them against the MANIFEST, joins them and installs from them
# (`pip install --no-index --find-links .whl/wheels ...`) when something it needs is missing.
# PACKAGES (default below) and PYVER (default 3.12) change what is fetched: PACKAGES=six checks the mechanism.
set -euo pipefail

dir=${1:-.whl}
pyver=${PYVER:-3.12}
packages=${PACKAGES:-"ray[tune]==2.60.0 mlflow==3.17.2 polars matplotlib pyarrow==25.0.1 scipy pyyaml pytest"}
python=${PYTHON:-python3}
mkdir -p "$dir/wheels"
# shellcheck disable=SC2086 - the package list splits into words on purpose
"$python" -m pip download --only-binary :all: --python-version "$pyver" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$dir/wheels" $packages
rm -f "$dir"/part-* "$dir/MANIFEST"
tar -cf - -C "$dir" wheels | split -b 59m - "$dir/part-"
(cd "$dir" && sha256sum part-* > MANIFEST)
rm -rf "$dir/wheels"
echo "carry_wheels: $(ls "$dir"/part-* | wc -l) parts in $dir ($(du -sh "$dir" | cut -f1)); carry $dir/part-* and" \
     "$dir/MANIFEST to the GPU box, where benchmarks/gpu_acceptance.sh installs from them"
