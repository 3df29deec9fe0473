"""Helm's own library (through helm-sdkpy) against the kube-sim binary.

Installs tests/helm/smoke-chart (every built-in kind a telo-runner chart
creates), reads each object back over kube-sim's HTTP API, lists the
release, uninstalls it and checks that everything is gone. Helm writes its
release Secrets with Kubernetes protobuf, so this also exercises kube-sim's
protobuf request bodies.

Run by tools/kube-sim/tests/helm.rs with KUBE_SIM_BIN set; needs
`pip install --ignore-requires-python helm-sdkpy pytest`.
"""

import asyncio
import base64
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import helm_sdkpy

CHART = Path(__file__).parent / "smoke-chart"
RELEASE = "smoke"
RELEASE_NS = "telo-runner"

# Every object of the chart: (API path, kind).
OBJECTS = [
    ("/api/v1/namespaces/smoke-ns", "Namespace"),
    ("/api/v1/namespaces/telo-runner/serviceaccounts/sa", "ServiceAccount"),
    ("/api/v1/namespaces/telo-runner/secrets/s", "Secret"),
    ("/api/v1/namespaces/telo-runner/configmaps/c", "ConfigMap"),
    ("/api/v1/namespaces/telo-runner/services/svc", "Service"),
    ("/apis/apps/v1/namespaces/telo-runner/deployments/d", "Deployment"),
    ("/apis/rbac.authorization.k8s.io/v1/namespaces/telo-sessions/roles/r", "Role"),
    (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/telo-sessions/rolebindings/rb",
        "RoleBinding",
    ),
    ("/apis/rbac.authorization.k8s.io/v1/clusterroles/cr", "ClusterRole"),
    ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/crb", "ClusterRoleBinding"),
    ("/api/v1/namespaces/telo-sessions/resourcequotas/q", "ResourceQuota"),
    (
        "/apis/networking.k8s.io/v1/namespaces/telo-sessions/networkpolicies/np",
        "NetworkPolicy",
    ),
    (
        "/apis/policy/v1/namespaces/telo-runner/poddisruptionbudgets/pdb",
        "PodDisruptionBudget",
    ),
]

RELEASE_SECRETS = (
    f"/api/v1/namespaces/{RELEASE_NS}/secrets?labelSelector=owner%3Dhelm%2Cname%3D{RELEASE}"
)


class KubeSim:
    def __init__(self, tmp: Path):
        binary = os.environ.get("KUBE_SIM_BIN")
        assert binary, "KUBE_SIM_BIN must name the kube-sim binary"
        self.kubeconfig = tmp / "kubeconfig"
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--kubeconfig", str(self.kubeconfig),
             "--namespace", "telo-runner", "--namespace", "telo-sessions"],
            stdout=subprocess.PIPE,
            text=True,
        )
        first = self.proc.stdout.readline().strip()
        assert first.startswith("listening on https://"), f"kube-sim said {first!r}"
        self.url = first.split()[-1]
        # The kubeconfig is written before the first line: its token is
        # what every request must carry, its CA what signed the server.
        fields = dict(
            line.strip().split(": ", 1)
            for line in self.kubeconfig.read_text().splitlines()
            if line.strip().startswith(("token: ", "certificate-authority-data: "))
        )
        self.token = fields["token"]
        self.tls = ssl.create_default_context(
            cadata=base64.b64decode(fields["certificate-authority-data"]).decode()
        )

    def get(self, path: str):
        """(status, JSON body) of a GET."""
        req = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.tls) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def stop(self):
        # SIGTERM lets kube-sim stop its processes and remove its sandbox
        # directory; SIGKILL only if it does not exit.
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def sim(tmp_path):
    s = KubeSim(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def helm_config(sim: KubeSim):
    return helm_sdkpy.Configuration(
        namespace=RELEASE_NS, kubeconfig=str(sim.kubeconfig), plain_http=True
    )


def test_lint_accepts_the_chart(sim):
    result = asyncio.run(helm_sdkpy.Lint(helm_config(sim)).run(str(CHART)))
    assert not result.get("Errors"), result
    # Severity 1 is INFO; anything higher is a warning or an error.
    assert all(m["Severity"] <= 1 for m in result.get("Messages") or []), result


def test_install_list_uninstall(sim):
    cfg = helm_config(sim)

    installed = asyncio.run(helm_sdkpy.Install(cfg).run(RELEASE, str(CHART), wait=False))
    assert installed["info"]["status"] == "deployed", installed["info"]
    assert installed["version"] == 1

    for path, kind in OBJECTS:
        code, obj = sim.get(path)
        assert code == 200, f"{kind} {path}: {code} {obj}"
        assert obj["kind"] == kind
        md = obj["metadata"]
        assert md["labels"]["app.kubernetes.io/managed-by"] == "Helm", (kind, md)
        assert md["annotations"]["meta.helm.sh/release-name"] == RELEASE, (kind, md)
        assert md["annotations"]["meta.helm.sh/release-namespace"] == RELEASE_NS
        assert md["uid"] and md["resourceVersion"] and md["creationTimestamp"]
    # Plain objects, stored as sent (plus the apiserver's defaults).
    _, secret = sim.get("/api/v1/namespaces/telo-runner/secrets/s")
    assert secret["data"] == {"a": "Yg=="} and "stringData" not in secret
    _, cm = sim.get("/api/v1/namespaces/telo-runner/configmaps/c")
    assert cm["data"] == {"a": "b"}
    _, pdb = sim.get("/apis/policy/v1/namespaces/telo-runner/poddisruptionbudgets/pdb")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}}
    _, crb = sim.get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/crb")
    assert crb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "cr",
    }

    # The release record: a Secret Helm wrote in protobuf.
    code, secrets = sim.get(RELEASE_SECRETS)
    assert code == 200, secrets
    assert [s["metadata"]["name"] for s in secrets["items"]] == [
        f"sh.helm.release.v1.{RELEASE}.v1"
    ]
    record = secrets["items"][0]
    assert record["type"] == "helm.sh/release.v1"
    assert record["metadata"]["labels"]["status"] == "deployed"
    assert record["data"]["release"]

    releases = asyncio.run(helm_sdkpy.List(cfg).run(all=True)) or []
    assert [(r["name"], r["info"]["status"]) for r in releases] == [(RELEASE, "deployed")]

    uninstalled = asyncio.run(helm_sdkpy.Uninstall(cfg).run(RELEASE, wait=True, timeout=60))
    assert uninstalled["release"]["info"]["status"] == "uninstalled", uninstalled

    for path, kind in OBJECTS:
        code, body = sim.get(path)
        assert code == 404, f"{kind} {path} still there: {body}"
    _, secrets = sim.get(RELEASE_SECRETS)
    assert secrets["items"] == []
    assert not (asyncio.run(helm_sdkpy.List(cfg).run(all=True)) or [])
