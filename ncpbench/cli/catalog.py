"""`ncpbench list` and `ncpbench show SLUG`: what the environments are."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from ncpbench.dataset import load
from ncpbench.registry import env_id
from ncpbench.spec import CommitmentType


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("list", help="list the environments")
    p.add_argument("--dataset", help="a spec folder (ours or the published layout); default: bundled")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("show", help="print an environment card and its spec")
    p.add_argument("slug")
    p.add_argument("--dataset", help="a spec folder (ours or the published layout); default: bundled")
    p.set_defaults(func=cmd_show)


def cmd_list(args: argparse.Namespace) -> int:
    ds = load(args.dataset)
    table = Table(title=f"{len(ds)} environments", show_lines=False)
    for col in ("slug", "version", "title", "role", "genres", "facts", "commitments", "nodes"):
        table.add_column(col, justify="right" if col in ("version", "facts", "commitments", "nodes") else "left")
    for spec in ds:
        table.add_row(spec.key, f"v{spec.meta.version}", spec.meta.title, spec.meta.player_role,
                      ", ".join(spec.meta.genres),
                      str(len(spec.initial_facts)), str(len(spec.commitments)), str(len(spec.trajectory)))
    Console(width=200).print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    spec = load(args.dataset)[args.slug]
    console = Console(width=120)
    card = Table(show_header=False, title=f"{spec.meta.title} — env card")
    card.add_column(style="bold")
    card.add_column()
    kinds = {k: sum(c.type is k for c in spec.commitments) for k in CommitmentType}
    card.add_row("id", f"{spec.key}  ({env_id(spec.key, spec.meta.version)})")
    card.add_row("version", str(spec.meta.version))
    card.add_row("player role", spec.meta.player_role)
    card.add_row("genres", ", ".join(spec.meta.genres))
    card.add_row("facts / commitments / nodes",
                 f"{len(spec.initial_facts)} / {len(spec.commitments)} / {len(spec.trajectory)}")
    card.add_row("commitment kinds", ", ".join(f"{k.value} {n}" for k, n in kinds.items()))
    card.add_row("first plot node", f"{spec.trajectory[0].id}: {spec.trajectory[0].description}")
    for c in spec.achievements():
        card.add_row(f"achievement {c.id}", f"{c.description} [node {c.node or '?'}]")
    console.print(card)
    console.print("\n[bold]Synopsis[/bold]\n" + spec.synopsis)
    console.print("\n[bold]Initial facts[/bold]")
    for f in spec.initial_facts:
        console.print(f"  {f.id}: {f.content}" + ("  (negated)" if f.negated else ""), markup=False)
    console.print("\n[bold]Commitments[/bold]")
    for c in spec.commitments:
        links = " ".join(f"{k}={v}" for k, v in c.links().items())
        console.print(f"  {c.id} [{c.type.value}] {links}\n    {c.description}\n    satisfied: "
                      f"{c.satisfaction_condition}\n    violated: {c.violation_condition}", markup=False)
    console.print("\n[bold]Trajectory[/bold]")
    for n in spec.trajectory:
        console.print(f"  {n.id}: {n.description}\n    trigger: {n.trigger_event}\n    delta: {n.key_delta}",
                      markup=False)
    return 0
