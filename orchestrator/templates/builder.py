"""Building a template image: fetch its packages with the network, then `docker build
--network none` over the parent image, then make it reachable for the backends that run it.

1. fetch: a short-lived container of the *parent* image, as root, on ORCH_TEMPLATE_FETCH_NETWORK,
   runs `recipe.fetch_script`: apt downloads (no install, no maintainer script), pip wheels
   only (no sdist, so no setup.py runs), npm with `--ignore-scripts`. Into a host directory.
2. build: the Dockerfile of `recipe.build_context` with the fetched files as its context, with
   no network at all; every setuid/setgid bit stripped as in the default image.
3. publish (kubernetes): pushed to ORCH_IMAGE_REGISTRY, or loaded into the engines of
   ORCH_K8S_NODE_ENGINES (a local cluster's nodes).

Every step appends to the build's log; any failure raises `TemplateBuildFailed` with a clear
reason, and the caller keeps the previous image."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import docker
from docker.errors import APIError, BuildError, ImageNotFound

from orchestrator.templates.recipe import (
    FETCHED_DEBS,
    FETCHED_NPM,
    FETCHED_WHEELS,
    TemplateRecipe,
    build_context,
    fetch_script,
)

Log = Callable[[str], None]
LABEL_TEMPLATE_BUILD = "org.sandbox-orchestrator.template-build"


class TemplateBuildFailed(RuntimeError):
    pass


def image_tag(repository: str, recipe_hash: str) -> str:
    return f"{repository}:{recipe_hash[:16]}"


def image_exists(client: docker.DockerClient, reference: str) -> bool:
    try:
        client.images.get(reference)
    except ImageNotFound:
        return False
    return True


def fetch(client: docker.DockerClient, recipe: TemplateRecipe, parent_image: str, into: Path, *,
          network: str, ca_bundle: Path | None, timeout_s: float, log: Log) -> None:  # fmt: skip
    """Step 1: the recipe's packages into `into` (debs/, wheels/, npm/). `ca_bundle`: the
    host's trust store, read-only, for pip and npm (a local TLS proxy's CA, as for sandboxes)."""
    if not (recipe.apt or recipe.pip or recipe.npm):
        return
    into.mkdir(parents=True, exist_ok=True)
    volumes = {str(into): {"bind": "/fetch", "mode": "rw"}}
    environment = {"HOME": "/tmp", "DEBIAN_FRONTEND": "noninteractive", "PIP_ROOT_USER_ACTION": "ignore"}
    if ca_bundle is not None:
        volumes[str(ca_bundle)] = {"bind": "/etc/template-fetch/ca.pem", "mode": "ro"}
        environment.update({
            "PIP_CERT": "/etc/template-fetch/ca.pem",
            "NPM_CONFIG_CAFILE": "/etc/template-fetch/ca.pem",
            "SSL_CERT_FILE": "/etc/template-fetch/ca.pem",
        })  # fmt: skip
    container = client.containers.run(
        parent_image,
        entrypoint=["/bin/sh", "-c", fetch_script(recipe)],
        user="0:0",
        network_mode=network,
        volumes=volumes,
        labels={LABEL_TEMPLATE_BUILD: "fetch"},
        environment=environment,
        detach=True,
    )
    try:
        try:
            outcome = container.wait(timeout=timeout_s)
        except Exception:  # the engine's read timeout: the fetch took too long
            container.kill()
            raise TemplateBuildFailed(f"fetching the packages took longer than {timeout_s:g} s") from None
        for line in container.logs(stdout=True, stderr=True).decode("utf-8", "replace").splitlines():
            log(line)
        code = int(outcome.get("StatusCode", -1))
        if code != 0:
            raise TemplateBuildFailed(f"fetching the packages failed (exit {code}); see the log")
    finally:
        try:
            container.remove(force=True)
        except APIError:
            pass


def docker_build(client: docker.DockerClient, context_dir: Path, tag: str, *, timeout_s: float, log: Log) -> str:
    """Step 2: `docker build --network none`; the new image's id."""
    image_id: str | None = None
    started = time.monotonic()
    try:
        for chunk in client.api.build(path=str(context_dir), tag=tag, network_mode="none", pull=False,
                                      rm=True, forcerm=True, decode=True, timeout=int(timeout_s)):  # fmt: skip
            if "error" in chunk:
                log(chunk["error"].rstrip())
                raise TemplateBuildFailed(f"the image build failed: {chunk['error'].strip()[:500]}")
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
            text = chunk.get("stream", "").rstrip()
            if text:
                log(text)
            if time.monotonic() - started > timeout_s:
                raise TemplateBuildFailed(f"the image build took longer than {timeout_s:g} s")
    except (APIError, BuildError) as exc:
        raise TemplateBuildFailed(f"the image build failed: {exc}") from exc
    if image_id is None:
        raise TemplateBuildFailed("the image build finished without an image id")
    return image_id


def build_template_image(
    client: docker.DockerClient,
    recipe: TemplateRecipe,
    *,
    name: str,
    recipe_hash: str,
    parent_image: str,
    tag: str,
    work_dir: Path,
    fetch_network: str,
    ca_bundle: Path | None,
    timeout_s: float,
    log: Log,
) -> str:
    """Steps 1 and 2 in `work_dir` (removed afterwards). Returns the image id."""
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    try:
        started = time.monotonic()
        fetch(client, recipe, parent_image, work_dir, network=fetch_network, ca_bundle=ca_bundle, timeout_s=timeout_s, log=log)
        context = build_context(recipe, parent_image=parent_image, name=name, recipe_digest=recipe_hash)
        for sub in (FETCHED_DEBS, FETCHED_WHEELS, FETCHED_NPM):
            (work_dir / sub).mkdir(exist_ok=True)
        for relative, text in context.files.items():
            target = work_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        (work_dir / "Dockerfile").write_text(context.dockerfile)
        log(f"== fetched in {time.monotonic() - started:.1f} s; docker build --network none -> {tag}")
        image_id = docker_build(client, work_dir, tag, timeout_s=timeout_s, log=log)
        log(f"== built {tag} ({image_id[:19]}) in {time.monotonic() - started:.1f} s")
        return image_id
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def publish(image: str, *, registry: str | None, node_engines: tuple[str, ...], log: Log) -> str:
    """Step 3: the reference pods use. With a registry: pushed there under the same tag;
    otherwise loaded into each node engine that lacks this very image id."""
    if registry:
        remote = f"{registry.rstrip('/')}/{image.rpartition('/')[2]}"
        _run(["docker", "tag", image, remote], log)
        _run(["docker", "push", remote], log, timeout=1800)
        return remote
    for engine in node_engines:
        load_into_engine(image, engine, log)
    return image


def load_into_engine(image: str, engine: str, log: Log = lambda _line: None) -> None:
    """Copy `image` from the host's Docker engine into `engine` (a node's own) unless it has
    that very image id already."""
    wanted = _image_id(image, None)
    if wanted is not None and _image_id(image, engine) == wanted:
        log(f"== {engine} has {image} already")
        return
    log(f"== loading {image} into {engine}")
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    try:
        done = subprocess.run(["docker", "-H", engine, "load", "-q"], stdin=save.stdout,
                              capture_output=True, text=True, timeout=1800)  # fmt: skip
    finally:
        assert save.stdout is not None
        save.stdout.close()
        save.wait(timeout=60)
    if done.returncode != 0:
        raise TemplateBuildFailed(f"loading the image into {engine} failed: {done.stderr.strip()[-300:]}")


def _run(command: list[str], log: Log, timeout: float = 120) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    for line in (done.stdout + done.stderr).splitlines()[-20:]:
        log(line)
    if done.returncode != 0:
        raise TemplateBuildFailed(f"`{' '.join(command[:2])}` failed: {done.stderr.strip()[-300:]}")


def _image_id(image: str, engine: str | None) -> str | None:
    command = ["docker", *(["-H", engine] if engine else []), "image", "inspect", "--format", "{{.Id}}", image]
    answer = subprocess.run(command, capture_output=True, text=True, timeout=60)
    return (answer.stdout.strip() or None) if answer.returncode == 0 else None
