"""The Kubernetes manifests under infra/kubernetes/: valid against Kubernetes' own schemas (kubernetes-validate,
strict), and each variant's securityContext what its name says. infra/container_test.sh plays both with
`podman kube play` and checks what they serve."""

from __future__ import annotations

import os

import kubernetes_validate
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("default", "restricted")


def documents(variant: str) -> dict[str, dict]:
    with open(os.path.join(ROOT, "infra", "kubernetes", variant, "sandlot.yaml")) as f:
        return {doc["kind"]: doc for doc in yaml.safe_load_all(f)}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_document_is_valid_against_kubernetes_schemas(variant):
    with open(os.path.join(ROOT, "infra", "kubernetes", variant, "sandlot.yaml")) as f:
        for doc in yaml.safe_load_all(f):
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_the_validator_refuses_what_kubernetes_would():
    deployment = documents("default")["Deployment"]
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8194"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_deployment_a_service_and_the_key_from_a_secret_with_probes_on_health(variant):
    docs = documents(variant)
    assert set(docs) == {"Deployment", "Service"}  # the Secret is the operator's (kubectl create secret)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    key = {e["name"]: e for e in container["env"]}["API_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {"name": "sandlot-api-key", "key": "api-key", "optional": False}
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"] and container["resources"]["requests"]["memory"]
    assert docs["Service"]["metadata"]["name"] == "sandbox"  # Dify's CODE_EXECUTION_ENDPOINT: http://sandbox:8194
    assert docs["Service"]["spec"]["ports"][0]["port"] == 8194
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/sandlot" in mounts


def test_default_has_no_security_context_so_the_chroot_jail():
    pod = documents("default")["Deployment"]["spec"]["template"]["spec"]
    assert "securityContext" not in pod and "securityContext" not in pod["containers"][0]


def test_restricted_meets_the_restricted_pod_security_standard_and_fixes_no_uid():
    pod = documents("restricted")["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert "runAsUser" not in pod["securityContext"] and "runAsUser" not in context  # OpenShift picks one
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        assert "emptyDir" in volumes[mount["name"]], mount
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/var/lib/sandlot", "/tmp"}
