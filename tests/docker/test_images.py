"""docker/*.Dockerfile: the backend image installs no torch, the worker image installs the
build argument's torch, both run as the same non-root user and copy packages the build
context holds."""

from __future__ import annotations

import re
import shlex
from fnmatch import fnmatch
from pathlib import PurePosixPath

import pytest

from tests.docker.compose_support import (
    APP_SERVICES,
    DOCKERFILES,
    PYPROJECT,
    ROOT,
    dockerfile_args,
    installed_extras,
    interpolate,
    parse_dockerfile,
    pip_installs,
    requirement_names,
)


def test_backend_image_installs_no_torch() -> None:
    path = DOCKERFILES["backend"]
    for word, rest in parse_dockerfile(path):
        assert "torch" not in rest.lower(), f"backend.Dockerfile: {word} {rest}"
    extras = installed_extras(path)
    assert extras == {"postgres"}
    optional = PYPROJECT["project"]["optional-dependencies"]
    pulled = requirement_names(PYPROJECT["project"]["dependencies"])
    for extra in extras:
        pulled |= requirement_names(optional[extra])
    assert "torch" not in pulled, f"the backend image would install torch through {sorted(extras)}"


def test_worker_image_installs_torch_from_build_args(compose: dict) -> None:
    path = DOCKERFILES["worker"]
    args = dockerfile_args(path)
    assert args["TORCH_SPEC"] == "torch==2.13.0"
    assert args["TORCH_INDEX_URL"].startswith("https://download.pytorch.org/whl/cu")
    installs = pip_installs(path)
    torch_idx = [i for i, cmd in enumerate(installs) if re.search(r"\$\{?TORCH_SPEC\}?", cmd)]
    project_idx = [i for i, cmd in enumerate(installs) if re.search(r"\.\[[^\]]*\bworker\b", cmd)]
    assert torch_idx and project_idx and torch_idx[0] < project_idx[0], "torch must come before the worker extra"
    assert re.search(r"--index-url\s+\"?\$\{?TORCH_INDEX_URL\}?", installs[torch_idx[0]])
    assert installed_extras(path) == {"worker", "postgres"}
    # the spec pins a torch the worker extra accepts, so pip keeps it instead of pulling another
    from packaging.requirements import Requirement

    pinned = Requirement(args["TORCH_SPEC"])
    wanted = next(
        Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["worker"] if r.startswith("torch")
    )
    version = next(iter(pinned.specifier)).version
    assert wanted.specifier.contains(version)
    # the same torch as the Makefile, and compose's build args default to the Dockerfile's
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^TORCH_SPEC \?= {re.escape(args['TORCH_SPEC'])}$", makefile, re.M)
    build_args = compose["services"]["worker"]["build"]["args"]
    for key in ("TORCH_SPEC", "TORCH_INDEX_URL"):
        assert interpolate(build_args[key], {}) == args[key]
        assert interpolate(build_args[key], {key: "x"}) == "x", f"{key} is not overridable"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_image_runs_as_the_same_non_root_user(name: str) -> None:
    users = [rest for word, rest in parse_dockerfile(DOCKERFILES[name]) if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    other = DOCKERFILES["worker" if name == "backend" else "backend"]
    assert [rest for word, rest in parse_dockerfile(other) if word == "USER"][-1] == users[-1]


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        parts = PurePosixPath(rel).parts
        hit = any(fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts)))
        if pattern.startswith("**/"):
            hit = hit or any(fnmatch(p, pattern[3:]) for p in parts)
        if hit:
            ignored = not negate
    return ignored


@pytest.mark.parametrize("name", APP_SERVICES)
def test_image_copies_the_packages_from_the_build_context(name: str) -> None:
    patterns = _dockerignore()
    for must in (".venv", "data", ".git", "docs/screenshots"):
        assert _ignored(must, patterns), f".dockerignore lets {must} into the build context"
    copied = set()
    for word, rest in parse_dockerfile(DOCKERFILES[name]):
        if word == "COPY" and "--from" not in rest:
            *sources, _dest = shlex.split(rest)
            for src in sources:
                src = str(PurePosixPath(src))
                assert (ROOT / src).exists(), f"COPY {src}: no such path"
                assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
                copied.add(src)
    # what pip needs to build the project: pyproject, its readme, every package
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= copied
    folders = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        if "." in package and package not in folders:
            continue  # a subpackage: inside its top folder
        folder = folders.get(package, package)
        assert (ROOT / folder / "__init__.py").is_file()
        assert folder in copied, f"{name} image lacks the {package} package ({folder}/)"
