"""The deployment files, checked without a Docker engine: docker-compose.yml parsed with pyyaml,
every faultlens command (including those inside a service's shell loop, the DaemonSet and the
systemd unit) parsed by the real CLI parser, every image pinned, the Dockerfile's base pinned, every
referenced file present, the OTel Collector config consistent, and every hooks file loadable by the
real hook loader."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from faultlens.controller.cli.main import build_parser
from faultlens.controller.hooks import load_hooks
from tests.conftest import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DEPLOY = REPO_ROOT / "docs" / "deploy"
PLACEHOLDER = "placeholder"

_COMPOSE_VAR = re.compile(
    r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
)
_SHELL_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def compose_interpolate(value: str) -> str:
    """Compose's own interpolation with an empty environment: ${VAR:-default} -> default, ${VAR} ->
    a placeholder, $$ -> $ (a literal dollar for the container's shell)."""
    def expand(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group(2) in (":-", "-"):
            return match.group(3)
        return PLACEHOLDER
    return _COMPOSE_VAR.sub(expand, value)


def _interpolated(node: Any) -> Any:
    if isinstance(node, str):
        return compose_interpolate(node)
    if isinstance(node, list):
        return [_interpolated(item) for item in node]
    if isinstance(node, dict):
        return {key: _interpolated(value) for key, value in node.items()}
    return node


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _interpolated(yaml.safe_load(COMPOSE.read_text()))


def faultlens_commands(service: dict[str, Any]) -> list[list[str]]:
    """The faultlens invocations a service runs: its command, or each `faultlens ...` inside a `sh
    -c` script (shell variables expanded from the service's environment)."""
    entrypoint = service.get("entrypoint") or []
    command = service.get("command") or []
    if isinstance(command, str):
        command = shlex.split(command)
    if entrypoint[:2] == ["/bin/sh", "-c"] or entrypoint[:2] == ["sh", "-c"]:
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        script = _SHELL_VAR.sub(
            lambda m: env.get(m.group(1) or m.group(2), PLACEHOLDER), " ".join(command)
        )
        lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        commands, current, at_start = [], None, True
        for token in lexer:
            separator = set(token) <= set(";&|")
            if separator:
                if current is not None:
                    commands.append(current)
                current = None
            elif current is not None:
                current.append(token)
            elif token == "faultlens" and at_start:
                current = []
            at_start = separator or token in ("do", "then", "else", "while", "until", "if")
        if current is not None:
            commands.append(current)
        return commands
    if command[:1] == ["faultlens"]:
        return [command[1:]]
    return []


def test_every_faultlens_command_parses_with_the_real_cli(compose):
    parser = build_parser()
    checked = {}
    for name, service in compose["services"].items():
        for argv in faultlens_commands(service):
            # argparse exits (SystemExit) on anything the CLI does not accept
            args = parser.parse_args(argv)
            checked[name] = args.command
    assert checked == {"node-agent": "collect", "serve": "serve"}


def test_a_wrong_command_would_be_caught(compose):
    service = dict(compose["services"]["node-agent"])
    service["command"] = ["faultlens", "collect", "--no-such-option"]
    with pytest.raises(SystemExit):
        for argv in faultlens_commands(service):
            build_parser().parse_args(argv)


def _pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return (
        bool(name)
        and "/" not in tag
        and tag not in ("", "latest")
        and any(c.isdigit() for c in tag)
    )


def test_every_image_is_pinned(compose):
    images = {name: service.get("image") for name, service in compose["services"].items()}
    assert all(images.values()), (
        f"services without an image: {[n for n, i in images.items() if not i]}"
    )
    unpinned = [image for image in images.values() if not _pinned(image)]
    assert not unpinned
    assert (
        not _pinned("minio/minio")
        and not _pinned("minio/minio:latest")
        and _pinned("otel/x:0.123.0")
    )
    # the image faultlens builds carries the package version
    version = re.search(
        r'^version = "([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M
    ).group(1)
    built = {
        service["image"]
        for service in compose["services"].values()
        if "faultlens" in service["image"]
    }
    assert built == {f"faultlens:{version}"}


def test_dockerfile_base_is_pinned_and_its_sources_exist():
    text = DOCKERFILE.read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert bases and all(re.match(r"^python:3\.11\.\d+-slim", base) for base in bases), bases
    for source in re.findall(r"^COPY\s+(.+)\s+\S+$", text, re.M):
        for path in source.split():
            assert (REPO_ROOT / path).exists(), f"Dockerfile copies {path}, which is missing"
    extras = re.search(r"ARG EXTRAS=(\S+)", text).group(1).split(",")
    declared = re.search(
        r"\[project\.optional-dependencies\](.*?)\n\[",
        (REPO_ROOT / "pyproject.toml").read_text(),
        re.S,
    ).group(1)
    assert all(re.search(rf"^{extra} = ", declared, re.M) for extra in extras)
    assert "torch==2.13.0" in text


def test_referenced_files_exist(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO_ROOT / source).exists(), f"{name} mounts {source}, which is missing"
        if "build" in service:
            context = (
                service["build"]
                if isinstance(service["build"], str)
                else service["build"]["context"]
            )
            assert (REPO_ROOT / context / "Dockerfile").is_file()
        for argv in faultlens_commands(service):
            for flag in ("--thresholds", "--rules", "--policy"):
                if flag in argv:
                    in_image = argv[argv.index(flag) + 1]
                    assert in_image.startswith("/app/")
                    assert (REPO_ROOT / in_image.removeprefix("/app/")).is_file(), in_image


def test_node_agent_has_nvml_kmsg_and_a_gpu(compose):
    agent = compose["services"]["node-agent"]
    assert "/dev/kmsg:/dev/kmsg" in agent["devices"]
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "utility" in d["capabilities"] for d in devices)
    (argv,) = faultlens_commands(agent)
    sources = argv[argv.index("--sources") + 1].split(",")
    assert {"nvml", "kmsg"} <= set(sources)
    assert compose["services"]["jupyter"]["command"][:2] == ["jupyter", "lab"]


def test_otel_collector_config_is_consistent(compose):
    service = compose["services"]["otel-collector"]
    mount = next(v for v in service["volumes"] if "otel-collector.yaml" in v)
    config = yaml.safe_load((REPO_ROOT / mount.split(":")[0]).read_text())
    assert service["command"] == [f"--config={mount.split(':')[1]}"]
    for pipeline in config["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], (kind, component)
    ports = {p.split(":")[0] for p in service["ports"]}
    endpoints = [config["receivers"]["otlp"]["protocols"][p]["endpoint"] for p in ("grpc", "http")]
    assert {e.rsplit(":", 1)[1] for e in endpoints} <= ports
    assert config["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1] in ports
    env = compose["services"]["node-agent"]["environment"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith(":4318")
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"


def test_daemonset_and_systemd_unit_run_a_real_command():
    parser = build_parser()
    daemonset = yaml.safe_load((DEPLOY / "kubernetes" / "daemonset.yaml").read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    argv = [re.sub(r"\$\(([A-Z_]+)\)", PLACEHOLDER, part) for part in container["command"]]
    assert argv[0] == "faultlens" and parser.parse_args(argv[1:]).command == "collect"
    assert {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True} in container["volumeMounts"]
    assert "nvidia.com/gpu" not in str(container.get("resources"))  # never takes GPUs from training
    assert (
        daemonset["spec"]["selector"]["matchLabels"].items()
        <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    )

    unit = (DEPLOY / "systemd" / "faultlens-collect.service").read_text()
    exec_start = re.search(r"^ExecStart=(.+)$", unit, re.M).group(1).replace("%H", "node-07")
    argv = shlex.split(exec_start)
    assert os.path.basename(argv[0]) == "faultlens"
    assert parser.parse_args(argv[1:]).command == "collect"
    env_file = re.search(r"^EnvironmentFile=(.+)$", unit, re.M).group(1)
    assert (
        Path(env_file).name == "faultlens.env" and (DEPLOY / "systemd" / "faultlens.env").is_file()
    )


@pytest.mark.parametrize(
    "path", sorted(str(p.relative_to(REPO_ROOT)) for p in DEPLOY.rglob("hooks.yaml"))
)
def test_hooks_files_load(path, monkeypatch):
    # a webhook hook refuses to load without its secret
    monkeypatch.setenv("FAULTLENS_WEBHOOK_SECRET", "s3cret")
    hooks = load_hooks(REPO_ROOT / path)
    assert hooks and len({hook.name for hook in hooks}) == len(hooks)
