"""A template's recipe, checked and turned into a Dockerfile without touching Docker.

A recipe is declarative (a parent, Debian packages, pip and npm packages, files, environment
variables): never Dockerfile text. Its content hash covers the recipe and the parent image's
id, so a changed parent is a new image too, and the same recipe over the same parent is the
same image (a second build is a no-op)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

DEFAULT_TEMPLATE = "default"
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
# Debian package names (lower case, digits, + - .; two characters at least) with an optional `=version`.
APT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?$")
# A pip requirement we accept: a project name and an optional `==version` (no URLs, no options).
PIP_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?(==[A-Za-z0-9.+!-]+)?$")
# An npm package: optionally scoped, optionally `@version`.
NPM_PATTERN = re.compile(r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(@[A-Za-z0-9.^~<>=|*+-]+)?$")
# File paths are written into the Dockerfile (COPY, chmod): no space, quote or shell character.
FILE_PATH_PATTERN = re.compile(r"^(/[A-Za-z0-9._@+-]+)+$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# The agent sets these for every shell (HOME, the per-user deps on PATH, the egress proxy): a
# template may not take them over.
RESERVED_ENV = frozenset({
    "PATH", "HOME", "TMPDIR", "PWD", "SHELL", "PYTHONPATH", "PIP_TARGET", "NPM_CONFIG_PREFIX",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "SANDBOX_AGENT_DIR",
})  # fmt: skip
# Files go anywhere but where the agent, the mounts or the system's identity live.
FORBIDDEN_FILE_PREFIXES = ("/opt/sandbox", "/proc", "/sys", "/dev", "/tmp", "/data", "/etc/passwd", "/etc/group",
                           "/etc/shadow", "/usr/local/bin/sandbox-entrypoint")  # fmt: skip
MAX_ITEMS = 64
MAX_FILES = 32
MAX_FILE_BYTES = 64 * 1024
MAX_ENV_VALUE = 4096
RECIPE_FORMAT = "1"


class RecipeInvalid(ValueError):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class TemplateRecipe:
    parent: str = DEFAULT_TEMPLATE
    apt: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()
    npm: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()  # (absolute path, text), sorted by path
    env: tuple[tuple[str, str], ...] = ()  # sorted by name

    def as_json(self) -> dict[str, object]:
        return {
            "parent": self.parent,
            "apt": list(self.apt),
            "pip": list(self.pip),
            "npm": list(self.npm),
            "files": dict(self.files),
            "env": dict(self.env),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> TemplateRecipe:
        return recipe_of(
            name=None,
            parent=data.get("parent"),  # type: ignore[arg-type]
            apt=data.get("apt"),  # type: ignore[arg-type]
            pip=data.get("pip"),  # type: ignore[arg-type]
            npm=data.get("npm"),  # type: ignore[arg-type]
            files=data.get("files"),  # type: ignore[arg-type]
            env=data.get("env"),  # type: ignore[arg-type]
        )


def check_name(name: str, *, allow_default: bool = False) -> str:
    if not NAME_PATTERN.match(name):
        raise RecipeInvalid(f"template name {name!r} must match [a-z0-9][a-z0-9-]{{0,39}}", "name")
    if name == DEFAULT_TEMPLATE and not allow_default:
        raise RecipeInvalid("the name 'default' is reserved for the built-in workbench image", "name")
    return name


def _items(values: list[str] | None, pattern: re.Pattern[str], field_name: str, what: str) -> tuple[str, ...]:
    values = list(values or [])
    if len(values) > MAX_ITEMS:
        raise RecipeInvalid(f"at most {MAX_ITEMS} {field_name} entries", field_name)
    for value in values:
        if not isinstance(value, str) or not pattern.match(value):
            raise RecipeInvalid(f"{field_name}: {value!r} is not {what}", field_name)
    return tuple(sorted(set(values)))


def _files(files: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    files = dict(files or {})
    if len(files) > MAX_FILES:
        raise RecipeInvalid(f"at most {MAX_FILES} files", "files")
    for path, text in files.items():
        parts = path.split("/")
        if (
            not path.startswith("/")
            or path.endswith("/")
            or any(p in ("", ".", "..") for p in parts[1:])
            or not FILE_PATH_PATTERN.match(path)
            or len(path) > 255
        ):
            raise RecipeInvalid(f"files: {path!r} is not a normalized absolute file path", "files")
        if any(path == p or path.startswith(p + "/") for p in FORBIDDEN_FILE_PREFIXES):
            raise RecipeInvalid(f"files: {path!r} is a place the sandbox itself owns", "files")
        if not isinstance(text, str) or len(text.encode()) > MAX_FILE_BYTES:
            raise RecipeInvalid(f"files: {path!r} must be text of at most {MAX_FILE_BYTES} bytes", "files")
    return tuple(sorted(files.items()))


def _env(env: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    env = dict(env or {})
    if len(env) > MAX_ITEMS:
        raise RecipeInvalid(f"at most {MAX_ITEMS} environment variables", "env")
    for key, value in env.items():
        if not ENV_NAME_PATTERN.match(key):
            raise RecipeInvalid(f"env: {key!r} is not a variable name", "env")
        if key in RESERVED_ENV:
            raise RecipeInvalid(f"env: {key} is set by the sandbox itself", "env")
        if not isinstance(value, str) or "\x00" in value or "\n" in value or len(value) > MAX_ENV_VALUE:
            raise RecipeInvalid(f"env: the value of {key} must be one line of at most {MAX_ENV_VALUE} characters", "env")
    return tuple(sorted(env.items()))


def recipe_of(
    *,
    name: str | None,
    parent: str | None = None,
    apt: list[str] | None = None,
    pip: list[str] | None = None,
    npm: list[str] | None = None,
    files: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> TemplateRecipe:
    """The checked recipe; `RecipeInvalid` names the first field that is wrong."""
    parent = parent or DEFAULT_TEMPLATE
    check_name(parent, allow_default=True)
    if name is not None and parent == name:
        raise RecipeInvalid("a template cannot be its own parent", "parent")
    recipe = TemplateRecipe(
        parent=parent,
        apt=_items(apt, APT_PATTERN, "apt", "a Debian package name"),
        pip=_items(pip, PIP_PATTERN, "pip", "a pip requirement (name, optional ==version)"),
        npm=_items(npm, NPM_PATTERN, "npm", "an npm package (name, optional @version)"),
        files=_files(files),
        env=_env(env),
    )
    if not (recipe.apt or recipe.pip or recipe.npm or recipe.files or recipe.env):
        raise RecipeInvalid("a template adds something: apt, pip, npm, files or env", "apt")
    return recipe


def recipe_hash(recipe: TemplateRecipe, parent_image_id: str) -> str:
    """The content hash a template image is tagged with."""
    canonical = json.dumps(recipe.as_json(), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256()
    for part in (RECIPE_FORMAT, canonical, parent_image_id):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class BuildContext:
    """What `docker build --network none` gets: the Dockerfile and the files it adds (relative
    paths in the context directory); the fetched packages go beside them (builder.py)."""

    dockerfile: str
    files: dict[str, str] = field(default_factory=dict)


FETCHED_DEBS = "debs"
FETCHED_WHEELS = "wheels"
FETCHED_NPM = "npm"


def build_context(recipe: TemplateRecipe, *, parent_image: str, name: str, recipe_digest: str) -> BuildContext:
    """The Dockerfile of a template: its parent plus the fetched packages, installed with no
    network, then no setuid/setgid file left (as in the default image), then the parent's user."""
    lines = [f"FROM {parent_image}", "USER root"]
    if recipe.apt:
        lines += [
            f"COPY {FETCHED_DEBS}/ /var/cache/template-debs/",
            "RUN DEBIAN_FRONTEND=noninteractive apt-get install -q -y --no-install-recommends "
            "/var/cache/template-debs/*.deb && rm -rf /var/cache/template-debs /var/lib/apt/lists/* "
            "/var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log",
        ]
    if recipe.pip:
        lines += [
            f"COPY {FETCHED_WHEELS}/ /var/cache/template-wheels/",
            "RUN python3 -m pip install --no-index --find-links /var/cache/template-wheels --no-cache-dir "
            "--disable-pip-version-check --break-system-packages --no-warn-script-location "
            + " ".join(json.dumps(p) for p in recipe.pip)
            + " && rm -rf /var/cache/template-wheels",
        ]
    if recipe.npm:
        lines.append(f"COPY {FETCHED_NPM}/ /usr/local/")
    files: dict[str, str] = {}
    for index, (path, text) in enumerate(recipe.files):
        source = f"files/{index}"
        files[source] = text
        lines.append(f"COPY {source} {json.dumps(path)[1:-1]}")
    if recipe.files:
        lines.append("RUN chmod 0644 " + " ".join(json.dumps(p) for p, _ in recipe.files))
    lines += [
        "RUN find / -xdev -type f -perm /6000 -exec chmod a-s {} + "
        '&& test -z "$(find / -xdev -type f -perm /6000 -print -quit)"',
        # Its own role and recipe: never taken for the default image (`build-image` finds that one by
        # role and recipe label, which a FROM would otherwise pass on). The agent-lock label stays.
        f"LABEL org.sandbox-orchestrator.role=template org.sandbox-orchestrator.recipe={recipe_digest} "
        f"org.sandbox-orchestrator.template={name}",
        "USER sandbox",
    ]
    return BuildContext("\n".join(lines) + "\n", files)


def fetch_script(recipe: TemplateRecipe) -> str:
    """The shell script the fetch container runs (as root, from the parent image, with the
    network): downloads only, nothing installed, no package script run."""
    steps = ["set -eu"]
    if recipe.apt:
        apt = " ".join(recipe.apt)
        steps += [
            "echo '== apt: fetching' " + json.dumps(apt),
            "mkdir -p /fetch/debs/partial",
            "apt-get -q -o APT::Sandbox::User=root update",
            "apt-get -q -y -o APT::Sandbox::User=root -o Dir::Cache::archives=/fetch/debs "
            f"--no-install-recommends --download-only install {apt}",
            "rm -rf /fetch/debs/partial /fetch/debs/lock",
            "ls /fetch/debs/*.deb >/dev/null",
        ]
    if recipe.pip:
        pip = " ".join(json.dumps(p) for p in recipe.pip)
        steps += [
            "echo '== pip: fetching' " + json.dumps(" ".join(recipe.pip)),
            f"python3 -m pip download --disable-pip-version-check --no-cache-dir --only-binary=:all: -d /fetch/wheels {pip}",
        ]
    if recipe.npm:
        npm = " ".join(json.dumps(p) for p in recipe.npm)
        steps += [
            "echo '== npm: fetching' " + json.dumps(" ".join(recipe.npm)),
            f"npm install --global --prefix /fetch/npm --ignore-scripts --no-audit --no-fund --cache /tmp/npm-cache {npm}",
        ]
    steps.append("echo '== fetched'")
    return "\n".join(steps) + "\n"
