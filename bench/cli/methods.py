"""`bench methods [--references [--markdown | --update PAGE]]`: the methods with their hyper-parameters, or their
fidelity record (bench.methods). `--update` rewrites the generated part of docs/fidelity.md and keeps the figures
written by hand below its marker, so regenerating the record never deletes them."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.config import UserError
from bench.store.folder import replace_file

# Everything after this line of docs/fidelity.md is written by hand (measured figures); everything before is generated.
MEASURED_MARKER = "<!-- measured: everything below is written by hand, not generated -->\n"


def update_page(page: Path, generated: str) -> None:
    """`page` becomes `generated`, the marker, then what followed the marker in `page` (nothing for a new page);
    written to a temporary file first, so an interrupted update leaves the old page whole."""
    old = page.read_text(encoding="utf-8") if page.is_file() else ""
    _, _, by_hand = old.partition(MEASURED_MARKER)
    replace_file(page, lambda tmp: tmp.write_text(generated + MEASURED_MARKER + by_hand, encoding="utf-8"))


def cmd_methods(args: argparse.Namespace) -> int:
    # torch loads with the commands that need it: `bench --help` and a mistyped flag answer at once
    from bench.methods import describe_params, fidelity_record, registry

    if (args.markdown or args.update) and not args.references:
        raise UserError("--markdown and --update format the fidelity record: use them with --references")
    if args.update is not None:
        if args.update.is_dir() or not args.update.parent.is_dir():
            raise UserError(f"--update {args.update}: give the path of a page in an existing folder "
                            "(docs/fidelity.md)")
        update_page(args.update, fidelity_record(markdown=True))
        print(f"updated the generated part of {args.update}; kept what is below its marker")
        return 0
    if args.references:
        print(fidelity_record(markdown=args.markdown), end="")
        return 0
    width = max(map(len, registry())) + 1
    for name, cls in registry().items():
        flags = "  [uses the true T: privileged diagnostic]" if cls.uses_true_transition else ""
        packs = "  [packs on a GPU]" if cls(2).packable() else ""
        print(f"{name:{width}s} {cls.title}{flags}{packs}")
        print(f"{'':{width}s} {cls.paper}")
        for line in describe_params(cls):
            print(f"{'':{width}s} {line}")
    return 0
