"""`python -m sandbox_agent --config <json file>` (or `--print-build`, or `--probe --config`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandbox_agent", description="The per-user sandbox tool agent.")
    parser.add_argument("--config", help="JSON file with the AgentConfig (see sandbox_agent.wire)")
    parser.add_argument("--print-build", action="store_true", help="print this code's BUILD id and exit")
    parser.add_argument(
        "--probe", action="store_true", help="exit 0 when the agent of --config answers /health (a pod's exec probe)"
    )
    args = parser.parse_args(argv)
    if args.print_build:
        from sandbox_agent.build import own_build_id

        print(own_build_id())
        return 0
    if not args.config:
        parser.error("--config is required")
    if args.probe:
        from sandbox_agent.probe import probe

        return 0 if probe(args.config) else 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    from sandbox_agent.server import load_config, serve

    try:
        serve(load_config(args.config))
        code = 0
    except SystemExit as stop:  # SIGTERM, after uvicorn's graceful shutdown (server.py)
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:  # a refusal to start (a bad token file, a directory at the socket path): say why
            print(stop.code, file=sys.stderr)
            code = 1
    # serve() has cleaned up (its processes, kernels, socket): exit without the interpreter's
    # teardown of every module and object, a good part of each sandbox's stop.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
