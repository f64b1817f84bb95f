"""``python -m app.tasks [--node N]... [--embedded] [--concurrency C]``: run a recovery worker."""

from __future__ import annotations

import argparse
import sys

from app.tasks.worker import queues_for, run_worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.tasks")
    parser.add_argument("--node", action="append", default=[])
    parser.add_argument("--embedded", action="store_true", help="also consume the cluster queue")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    try:
        queues = queues_for(args.node, cluster=args.embedded or not args.node)
    except ValueError as exc:
        sys.exit(f"rlguard worker: {exc}")
    name = "embedded" if args.embedded else (f"node-{args.node[0]}" if args.node else "cluster")
    run_worker(queues, name=name, concurrency=args.concurrency, loglevel=args.loglevel)


if __name__ == "__main__":
    main()
