"""The `orchestrator` command line."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from collections.abc import Sequence

from orchestrator.log import configure_logging, kv

log = logging.getLogger("orchestrator")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8700


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from orchestrator.http.app import create_app
    from orchestrator.service import OrchestratorService
    from orchestrator.settings import load_settings
    from orchestrator.state_store import SchemaTooNewError

    settings = load_settings()
    host = args.host
    if not settings.auth_enabled:
        if not _is_loopback(host):
            log.warning("no API or admin token is set: refusing to listen on %s %s", host, kv(listening_on=DEFAULT_HOST))
            host = DEFAULT_HOST
        log.warning(
            "no API or admin token is set: authentication is off and the server listens on loopback only %s",
            kv(host=host, port=args.port),
        )
    try:
        service = OrchestratorService(settings)
    except SchemaTooNewError as exc:
        print(f"orchestrator: {exc}", file=sys.stderr)
        return 2
    log.info("serving %s", kv(host=host, port=args.port, data_dir=settings.layout.root))
    uvicorn.run(create_app(service), host=host, port=args.port, log_level=args.log_level.lower(), access_log=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description="Sandbox Orchestrator")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP API")
    serve.add_argument("--host", default=DEFAULT_HOST)
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    return args.func(args)
