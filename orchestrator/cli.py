"""The `orchestrator` command line."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.log import configure_logging, kv

if TYPE_CHECKING:
    from orchestrator.settings import Settings

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


def _settings(command: str, **overrides: object) -> Settings | None:
    """The settings, or None after one line per bad setting (naming it and what it accepts)."""
    from pydantic import ValidationError

    from orchestrator.settings import load_settings, settings_error_lines

    try:
        return load_settings(**overrides)
    except ValidationError as exc:
        for line in settings_error_lines(exc):
            print(f"orchestrator {command}: {line}", file=sys.stderr)
        return None


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from orchestrator.descriptors.budget import BudgetSettingsError, plan_for
    from orchestrator.settings import ApiSettings, DescriptorSettings
    from orchestrator.descriptors.process_limit import LimitRefused, raise_descriptor_limit
    from orchestrator.http.app import create_app
    from orchestrator.http.server_protocol import bounded_protocol
    from orchestrator.service import OrchestratorService
    from orchestrator.startup_checks import StartupRefused
    from orchestrator.state_store import SchemaTooNewError

    settings = _settings("serve")
    if settings is None:
        return 2
    host = args.host
    if not settings.auth_enabled:
        if not _is_loopback(host):
            # Without a token anyone who reaches the port could run code in every user's sandbox.
            print(
                f"orchestrator serve: refusing to listen on {host} without a token: set ORCH_API_TOKEN (and "
                f"ORCH_ADMIN_TOKEN) or listen on loopback (--host {DEFAULT_HOST})",
                file=sys.stderr,
            )
            return 2
        log.warning(
            "no API or admin token is set: authentication is off and the server listens on loopback only %s",
            kv(host=host, port=args.port),
        )
    if "public_base_url" not in settings.model_fields_set:
        # Unset: the public upload URLs point at this very server, whatever port it got.
        url_host = host if host not in ("0.0.0.0", "::") else DEFAULT_HOST
        url_host = f"[{url_host}]" if ":" in url_host else url_host
        settings = _settings("serve", public_base_url=f"http://{url_host}:{args.port}")
        if settings is None:
            return 2
        log.info("ORCH_PUBLIC_BASE_URL is not set: upload URLs use %s", kv(public_base_url=settings.public_base_url))
    try:
        # Before anything opens: the budget is planned from the limit the process ends up with.
        limit = raise_descriptor_limit(settings.fd_limit)
        plan_for(limit.after, DescriptorSettings.of(settings))  # a split that does not fit: refused like a bad setting
    except (LimitRefused, BudgetSettingsError) as exc:
        print(f"orchestrator serve: {exc}", file=sys.stderr)
        return 2
    log.info("descriptor limit %s", kv(before=limit.before, now=limit.after, hard=limit.hard))
    try:
        service = OrchestratorService(settings, exclusive=True)
    except (SchemaTooNewError, StartupRefused) as exc:
        print(f"orchestrator serve: {exc}", file=sys.stderr)
        return 2
    from orchestrator.malloc_tuning import return_large_buffers

    # Payload buffers go back to the OS when freed: the memory bound of docs/lifecycle.md.
    tuned = return_large_buffers()
    log.info("serving %s", kv(host=host, port=args.port, data_dir=settings.layout.root, mmap_threshold_fixed=tuned))
    api = ApiSettings.of(settings)
    uvicorn.run(
        create_app(service),
        host=host,
        port=args.port,
        log_level=args.log_level.lower(),
        access_log=False,
        # Bounds before any token is checked (issue 12 item 5): the request head's size and
        # time (server_protocol.py), idle keep-alive connections, connections at once.
        http=bounded_protocol(api),
        h11_max_incomplete_event_size=api.http_max_header_bytes,
        timeout_keep_alive=api.http_keep_alive_s,
        limit_concurrency=api.http_limit_concurrency,
    )
    return 0


def cmd_build_image(args: argparse.Namespace) -> int:
    import docker
    from docker.errors import DockerException

    from orchestrator.sandboxes.image.build import BuildSources, ImageBuildError, ImageBuilder
    from orchestrator.sandboxes.image.recipe import RecipeError

    settings = _settings("build-image")
    if settings is None:
        return 2
    image = args.image or settings.sandbox_image
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except DockerException as exc:
        print(f"orchestrator build-image: no Docker engine answers: {exc}", file=sys.stderr)
        return 2
    try:
        builder = ImageBuilder(client, BuildSources.from_checkout(), image=image, progress=lambda line: print(line, flush=True))
        result = builder.build(base_image=args.base_image, force=args.force)
    except (ImageBuildError, RecipeError) as exc:
        print(f"orchestrator build-image: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    verb = "built" if result.built else "up to date"
    print(f"{verb}: {result.image} {result.image_id[:19]} recipe={result.recipe[:12]} ({result.seconds:.1f} s)")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from orchestrator.service import build_skill_service

    settings = _settings("gc")
    if settings is None:
        return 2
    days = settings.skill_gc_days if args.days is None else args.days
    if days < 0:
        print("orchestrator gc: --days must not be negative", file=sys.stderr)
        return 2
    skills = build_skill_service(settings)
    report = skills.collect_garbage(max_age_days=days, dry_run=args.dry_run, verify=args.verify)
    print(f"skill store GC {kv(days=days)} {report.summary()}")
    for fingerprint, name in report.removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {kv(skill=name, fingerprint=fingerprint)}")
    for fingerprint, name in report.corrupt:
        print(f"corrupt {kv(skill=name, fingerprint=fingerprint)}")
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from orchestrator.client import OrchestratorClient
    from orchestrator.smoke import SmokeOptions, run_smoke

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per check, not per request
    token = args.token or os.environ.get("ORCH_API_TOKEN")
    admin_token = args.admin_token or os.environ.get("ORCH_ADMIN_TOKEN")
    options = SmokeOptions(
        owner_user_id=args.owner_user,
        member_user_id=args.member_user,
        data_dir=Path(args.data_dir).resolve() if args.data_dir else None,
        backend=args.backend,
        keep=args.keep,
        url=args.url,
        credential_upstream_ca=Path(args.credential_upstream_ca).resolve() if args.credential_upstream_ca else None,
    )
    with OrchestratorClient(args.url, token=token, admin_token=admin_token, timeout=args.timeout) as client:
        return run_smoke(client, options, sys.stdout)


def cmd_mcp(args: argparse.Namespace) -> int:
    import os

    from orchestrator.mcp.stdio_relay import RelayOptions, main

    # stderr stays readable (stdout is the protocol): no line per HTTP request from either
    # client library (the API client's httpx, the MCP transport's httpx2) at INFO.
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    options = RelayOptions(
        url=args.url,
        token=args.token or os.environ.get("ORCH_API_TOKEN"),
        session_id=args.session,
        owner_user_id=args.owner,
        speaker_user_id=args.speaker,
        trigger=args.trigger,
        channel=args.channel,
    )
    return main(options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description="Sandbox Orchestrator")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP API")
    serve.add_argument("--host", default=DEFAULT_HOST)
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.set_defaults(func=cmd_serve)
    build = sub.add_parser(
        "build-image",
        help="build the sandbox image offline (local Debian base, host wheelhouse, docker build --network none)",
    )
    build.add_argument("--image", help="image reference to tag (default: ORCH_SANDBOX_IMAGE)")
    build.add_argument(
        "--base-image", help="use this local image as the base instead of building one with debootstrap"
    )
    build.add_argument("--force", action="store_true", help="rebuild even if an image with the same recipe exists")
    build.set_defaults(func=cmd_build_image)
    gc = sub.add_parser("gc", help="remove skill-store content no view uses (docs/skills.md)")
    gc.add_argument("--days", type=float, default=None, help="unused for this long (default: ORCH_SKILL_GC_DAYS)")
    gc.add_argument("--dry-run", action="store_true", help="report what would be removed, remove nothing")
    gc.add_argument("--verify", action="store_true", help="also re-hash every entry; corrupt ones are removed")
    gc.set_defaults(func=cmd_gc)
    smoke = sub.add_parser(
        "smoke", help="run the group-chat acceptance checks against a live server: a PASS/FAIL line per check"
    )
    smoke.add_argument("--url", default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}", help="the server's base URL")
    smoke.add_argument("--token", help="the bot token (default: ORCH_API_TOKEN; none when auth is off)")
    smoke.add_argument(
        "--admin-token",
        help="the admin token (default: ORCH_ADMIN_TOKEN; none when auth is off): lets the smoke install "
        "its own skill through the admin API when the server has none",
    )
    smoke.add_argument(
        "--data-dir",
        help="the server's ORCH_DATA_DIR on this machine: the smoke writes its own skill there "
        "(without it: a system skill the server has, else one installed through the admin API)",
    )
    smoke.add_argument("--owner-user", type=int, help="user id of owner A (default: a fresh random id)")
    smoke.add_argument("--member-user", type=int, help="user id of member B (default: A + 1)")
    smoke.add_argument("--backend", choices=["auto", "docker", "process", "kubernetes"], help="set as A's and B's backend")
    smoke.add_argument(
        "--credential-upstream-ca",
        help="the file the server's ORCH_EGRESS_UPSTREAM_CA_BUNDLE names (a server with credentials on and "
        "ORCH_EGRESS_ALLOW_LOOPBACK=true): the smoke writes its HTTPS upstream's CA there and checks a credential "
        "end to end (a check of its own, run only with this option)",
    )
    smoke.add_argument("--keep", action="store_true", help="keep the smoke's sessions afterwards")
    smoke.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds")
    smoke.set_defaults(func=cmd_smoke)
    mcp = sub.add_parser(
        "mcp", help="a stdio MCP server for desktop clients: starts a run and relays to its MCP endpoint (docs/mcp.md)"
    )
    mcp.add_argument("--url", default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}", help="the orchestrator's base URL")
    mcp.add_argument("--token", help="the bot token (default: ORCH_API_TOKEN; none when auth is off)")
    where = mcp.add_mutually_exclusive_group(required=True)
    where.add_argument("--session", help="start the run in this existing session")
    where.add_argument("--owner", type=int, help="start the run in a new session of this user")
    mcp.add_argument("--channel", default="web", help="the new session's channel (with --owner; default: web)")
    mcp.add_argument("--speaker", type=int, help="the user who speaks (a group member: the run's runtime identity)")
    mcp.add_argument("--trigger", default="web", help="the run's trigger (default: web)")
    mcp.set_defaults(func=cmd_mcp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    return args.func(args)
