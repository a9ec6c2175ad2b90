"""`ncpbench lint [PATH...]`: quality findings beyond validity, one line each, and a summary.

Exit 0: no errors (warnings allowed unless --strict). Exit 1: lint errors, or warnings with --strict.
Exit 2: bad input (a missing file, unreadable YAML, a spec the validator rejects): one line per
problem, and nothing else is wrong with the files that could be read.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from ncpbench.cli.validate import spec_files
from ncpbench.lint import RULES, lint_file
from ncpbench.validation import Finding, Severity


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lint", help="quality rules beyond validity (default: the bundled environments)",
                       description="Spec quality rules: " + ", ".join(RULES) + ".")
    p.add_argument("paths", nargs="*", help="spec files or folders")
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    p.add_argument("--rule", action="append", choices=RULES, metavar="NAME",
                   help=f"only this rule (repeatable): {', '.join(RULES)}")
    p.set_defaults(func=cmd_lint)


def cmd_lint(args: argparse.Namespace) -> int:
    files, bad = spec_files(args.paths)
    found: list[Finding] = []
    for path in files:
        spec, findings = lint_file(path, args.rule)
        if spec is None:
            bad += findings
        else:
            found += findings
    for f in bad:
        print(f, file=sys.stderr)
    for f in found:
        print(f)
    n_err = sum(f.severity is Severity.ERROR for f in found)
    n_warn = len(found) - n_err
    per_rule = Counter(getattr(f, "rule", "") for f in found)
    unread = len({f.file for f in bad})
    clean = len(files) - len({f.file for f in bad} & {str(p) for p in files}) - len({f.file for f in found})
    rules = ", ".join(f"{rule} {per_rule[rule]}" for rule in RULES if per_rule[rule])
    print(f"{len(files)} files linted: {clean} clean, {n_err} errors, {n_warn} warnings"
          + (f" ({rules})" if rules else "") + (f"; {unread} could not be read" if unread else ""))
    if bad:
        return 2
    return 1 if n_err or (args.strict and n_warn) else 0
