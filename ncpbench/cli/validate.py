"""`ncpbench validate [PATH...]`: one line per finding, a summary, exit 1 on any error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ncpbench.dataset import bundled_dir, index_entries
from ncpbench.validation import Finding, Severity, validate_file


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check spec files (default: the bundled environments)")
    p.add_argument("paths", nargs="*", help="spec files or folders")
    p.add_argument("--quiet-warnings", action="store_true", help="print errors only")
    p.set_defaults(func=cmd_validate)


def spec_files(paths: list[str]) -> tuple[list[Path], list[Finding]]:
    files: list[Path] = []
    findings: list[Finding] = []
    for raw in paths or [str(bundled_dir())]:
        p = Path(raw)
        if p.is_dir():
            found, problems = index_entries(p)
            findings += problems
            for f in found:
                if f.exists():
                    files.append(f)
                else:
                    findings.append(Finding(str(f), f.stem, "-", "listed in index.yaml but missing"))
        elif p.exists():
            files.append(p)
        else:
            findings.append(Finding(raw, "-", "-", "no such file or folder"))
    return files, findings


def cmd_validate(args: argparse.Namespace) -> int:
    files, findings = spec_files(args.paths)
    for path in files:
        findings += validate_file(path)[1]
    shown = [f for f in findings if not (args.quiet_warnings and f.severity is Severity.WARNING)]
    for f in shown:
        print(f)
    n_err = sum(f.severity is Severity.ERROR for f in findings)
    n_warn = len(findings) - n_err
    bad = len({f.file for f in findings if f.severity is Severity.ERROR})
    print(f"{len(files)} files checked: {len(files) - bad if bad <= len(files) else 0} valid, "
          f"{n_err} errors, {n_warn} warnings", file=sys.stderr if n_err else sys.stdout)
    return 1 if n_err else 0
