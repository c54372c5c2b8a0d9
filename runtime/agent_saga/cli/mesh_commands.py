"""``agent-saga mesh merge`` and ``agent-saga mesh verify``: offline device logs.

``merge`` unions replicas (directories of ``<device>.wal`` files) into one directory;
``verify`` checks every device's chain in the union and names every conflict. Exit codes:
0 intact and conflict-free, 1 a broken chain, a damaged line or a conflict, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..mesh import MeshView, RecordSet
from ..mesh.gset import Damage


def register(sub: Any) -> None:
    """Add ``mesh`` to the command line."""
    p = sub.add_parser("mesh", help="merge and verify the local logs of offline devices")
    msub = p.add_subparsers(dest="mesh_command", required=True, metavar="ACTION")

    q = msub.add_parser("merge", help="union replicas into one directory (never rewrites a record)")
    q.add_argument("replicas", nargs="+", metavar="DIR",
                   help="replica directories of <device>.wal files (or single .wal files)")
    q.add_argument("--out", required=True, metavar="DIR",
                   help="where the merged replica goes (its current content is merged in too)")
    q.add_argument("--json", action="store_true", help="print the result as JSON")
    q.set_defaults(handler=cmd_merge)

    q = msub.add_parser("verify", help="check every device's chain in the union; name every conflict")
    q.add_argument("replicas", nargs="+", metavar="DIR",
                   help="replica directories of <device>.wal files (or single .wal files)")
    q.add_argument("--order", action="store_true",
                   help="also print every record in the display order (lamport, device, seq)")
    q.add_argument("--json", action="store_true", help="print the result as JSON")
    q.set_defaults(handler=cmd_verify)


def _report(view: MeshView, damage: list[Damage], *, order: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ok": view.ok and not damage,
        "records": len(view.records),
        "devices": {
            d: {"ok": r.ok, "records": r.records, "last_seq": r.last_seq, "head": r.head,
                "first_bad_seq": r.first_bad_seq, "location": r.location, "reason": r.reason}
            for d, r in view.chains.items()
        },
        "conflicts": [c.to_dict() for c in view.conflicts],
        "damaged": [{"location": x.location, "message": x.message} for x in damage],
    }
    if order:
        out["order"] = [
            {"device": d, "seq": r.seq, "type": r.type, "saga": r.saga, "step": r.step, "hash": r.hash}
            for d, r in view.ordered()
        ]
    return out


def _print(view: MeshView, damage: list[Damage], *, order: bool) -> None:
    for d, res in view.chains.items():
        print(f"device {d}: {res.describe()}")
    for x in damage:
        print(f"DAMAGED {x.location}: {x.message}")
    for c in view.conflicts:
        print(c.describe())
    if order:
        for d, r in view.ordered():
            step = f" {r.step}" if r.step else ""
            print(f"  {d} seq {r.seq} {r.type} {r.saga}{step}")
    verdict = "OK" if view.ok and not damage else "NOT OK"
    print(f"{verdict}: {_n(len(view.records), 'record')} of {_n(len(view.chains), 'device')}, "
          f"{_n(len(view.conflicts), 'conflict')}, {_n(len(damage), 'damaged line')}")


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def cmd_merge(args: argparse.Namespace) -> int:
    """Union the replicas (and what --out holds) into --out."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"--out {out} is a file: give the directory the merged replica goes to")
    sources = [*args.replicas, *([out] if out.is_dir() else [])]
    merged, damage = RecordSet.load(*sources)
    written = merged.write(out)
    view = MeshView(merged)
    if args.json:
        print(json.dumps({**_report(view, damage, order=False),
                          "written": [str(p) for p in written]}, indent=2))
    else:
        print(f"merged {_n(len(args.replicas), 'replica')} into {out}: {_n(len(written), 'device log')}")
        _print(view, damage, order=False)
    return 0 if view.ok and not damage else 1


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify the union of the replicas."""
    merged, damage = RecordSet.load(*args.replicas)
    view = MeshView(merged)
    if args.json:
        print(json.dumps(_report(view, damage, order=args.order), indent=2))
    else:
        _print(view, damage, order=args.order)
    return 0 if view.ok and not damage else 1
