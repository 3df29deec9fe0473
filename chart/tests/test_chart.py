"""The telo-runner chart, installed with Helm's own library into kube-sim.

Each test starts a fresh kube-sim (the binary named by KUBE_SIM_BIN), installs
the chart with one set of values through helm-sdkpy, and reads back over the
simulated apiserver's REST API what landed. Run with:

    KUBE_SIM_BIN=target/debug/kube-sim python3 -m pytest chart/tests -q

(`cargo test -p telo-runner --test chart` does exactly that.)

kube-sim does not serve monitoring.coreos.com, so the ServiceMonitor is
checked through Helm's lint of a copy of the chart with it enabled, and
through the error an install with it enabled gets from a cluster without the
Prometheus Operator.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_sdkpy
import pytest
import yaml

CHART = Path(__file__).resolve().parent.parent
RELEASE = "telo"
RUNNER_NS = "telo-runner"
# The runner lives in the release's namespace: the tests install as the
# README does, `helm install … -n telo-runner --create-namespace`.
RELEASE_NAMESPACE = RUNNER_NS
SESSION_NS = "telo-sessions"
NAME = "telo-k8s-runner"

OLD_KEYS_MESSAGE = (
    "sessionIngress.* was renamed to sessionRouting.*: baseDomain stays, className "
    "and tls move under sessionRouting.ingress, controllerNamespace becomes "
    "sessionRouting.dataPlaneNamespace (it must name the routing DATA PLANE, which "
    "is not an ingress controller under Gateway API). See 'Install with Helm' in the telo-runner README."
)

# A self-signed certificate is not needed: the chart stores what it is given.
TLS_CERT = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
TLS_KEY = "-----BEGIN PRIVATE KEY-----\nMIIBfake\n-----END PRIVATE KEY-----\n"

# What every replica is told about itself and its peers, whatever the
# other values.
REPLICA_ENV = {
    "POD_NAME": "field:metadata.name",
    "POD_IP": "field:status.podIP",
    "RUNNER_REPLICA_ID": "field:metadata.name",
    "RUNNER_PEER_TOKEN_FILE": "/etc/telo/peer/token",
}

# The Deployment's environment with the default values: every variable the
# chart always sets, and nothing it sets only on request.
DEFAULT_ENV = {
    **REPLICA_ENV,
    "RUNNER_LEASE_DURATION_SECONDS": "15",
    "RUNNER_BACKEND": "kubernetes",
    "PORT": "8062",
    "LOG_LEVEL": "info",
    "LOG_FORMAT": "json",
    "RUNNER_SELF_URL": "http://telo-k8s-runner.telo-runner.svc:8062",
    "RUNNER_SESSION_NAMESPACE": "telo-sessions",
    "RUNNER_MANAGED_BY": "telo-k8s-runner",
    "RUNNER_ORPHAN_POLICY": "adopt",
    "RUNNER_START_DEADLINE_SECONDS": "120",
    "RUNNER_MAX_SESSIONS": "32",
    "RUNNER_INIT_IMAGE": "busybox:stable",
    "RUNNER_WATCH_SESSIONS": "false",
    "RUNNER_MAX_CPU": "500m",
    "RUNNER_MAX_MEMORY": "512Mi",
    "RUNNER_MAX_TTL_SECONDS": "3600",
    "RUNNER_MAX_EPHEMERAL_STORAGE": "1Gi",
    "RUNNER_APP_MAX_CPU": "500m",
    "RUNNER_APP_MAX_MEMORY": "512Mi",
    "RUNNER_APP_MAX_TTL_SECONDS": "21600",
    "RUNNER_APP_MAX_EPHEMERAL_STORAGE": "1Gi",
    "RUNNER_BASE_IMAGE_CATALOG_ENABLED": "true",
    "RUNNER_BASE_IMAGE_REPO": "telorun/node",
    "RUNNER_BASE_IMAGE_PINNED_ONLY": "true",
    "RUNNER_BASE_IMAGE_EXCLUDE_SHA": "true",
    "RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE": "true",
    "RUNNER_BASE_IMAGE_LIMIT": "20",
    "RUNNER_BASE_IMAGE_REFRESH_SECONDS": "3600",
    "SESSION_ROUTING_MODE": "auto",
    "SESSION_ROUTE_READY_TIMEOUT_SECONDS": "60",
}

# What watch sessions (checkpoints) and catalog entries (their pods' env)
# add to the session Role.
SECRETS_RULE = {"apiGroups": [""], "resources": ["secrets"],
                "verbs": ["get", "list", "watch", "create", "patch", "delete"]}
CATALOG_FOR_RBAC = {"hello": {"image": "ghcr.io/example/hello:1", "env": {"KEY": "v"}}}

# The verbs the runner uses, and no others.
SESSION_ROLE_RULES = [
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods/attach"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["services"],
     "verbs": ["get", "create", "update", "delete"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"],
     "verbs": ["get", "list", "watch", "create", "update", "delete"]},
    {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"],
     "verbs": ["get", "list", "watch", "create", "update", "delete"]},
]
PROBE_CLUSTER_ROLE_RULES = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingressclasses"],
     "verbs": ["get", "list"]},
]
PROBE_CLUSTER_ROLE = f"{NAME}-{RELEASE_NAMESPACE}-probe"
# The runner's Role in its own namespace: the replicas' Leases.
LEASE_ROLE = f"{NAME}-leases"
LEASE_ROLE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
]


# --- kube-sim ----------------------------------------------------------------


@dataclass
class Cluster:
    base: str
    kubeconfig: str

    def token(self) -> str:
        """The bearer token kube-sim wrote into its kubeconfig."""
        with open(self.kubeconfig) as f:
            return yaml.safe_load(f)["users"][0]["user"]["token"]

    def tls(self) -> ssl.SSLContext:
        """Trusts the CA kube-sim wrote into its kubeconfig, nothing else."""
        with open(self.kubeconfig) as f:
            cluster = yaml.safe_load(f)["clusters"][0]["cluster"]
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        return ssl.create_default_context(cadata=ca)

    def open(self, req: urllib.request.Request):
        return urllib.request.urlopen(req, timeout=10, context=self.tls())

    def request(
        self, path: str, method: str = "GET", body: dict[str, Any] | None = None
    ) -> urllib.request.Request:
        """A request to kube-sim carrying its kubeconfig's token."""
        headers = {"Authorization": f"Bearer {self.token()}"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        return urllib.request.Request(
            f"{self.base}{path}", data=data, headers=headers, method=method
        )

    def get(self, path: str) -> dict[str, Any] | None:
        """GET an object; None when the apiserver says 404."""
        try:
            with self.open(self.request(path)) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def must_get(self, path: str) -> dict[str, Any]:
        obj = self.get(path)
        assert obj is not None, f"{path} was not created"
        return obj

    def delete(self, path: str) -> None:
        try:
            self.open(self.request(path, "DELETE")).close()
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise

    def config(self, namespace: str = RELEASE_NAMESPACE) -> helm_sdkpy.Configuration:
        return helm_sdkpy.Configuration(
            namespace=namespace, kubeconfig=self.kubeconfig, plain_http=True
        )

    def install(
        self,
        values: dict[str, Any] | None = None,
        namespace: str = RELEASE_NAMESPACE,
        create_namespace: bool = True,
    ) -> dict[str, Any]:
        return asyncio.run(
            helm_sdkpy.Install(self.config(namespace)).run(
                RELEASE, str(CHART), values=values or {}, wait=False, timeout=60,
                create_namespace=create_namespace,
            )
        )

    def upgrade(self, values: dict[str, Any] | None = None) -> dict[str, Any]:
        return asyncio.run(
            helm_sdkpy.Upgrade(self.config(RELEASE_NAMESPACE)).run(
                RELEASE, str(CHART), values=values or {}, wait=False, timeout=60,
            )
        )

    def install_error(self, values: dict[str, Any]) -> str:
        with pytest.raises(helm_sdkpy.HelmError) as raised:
            self.install(values)
        return str(raised.value)


def kube_sim_bin() -> str:
    path = os.environ.get("KUBE_SIM_BIN")
    if not path:
        pytest.fail(
            "KUBE_SIM_BIN is not set: point it at a kube-sim binary "
            "(cargo build -p kube-sim; target/debug/kube-sim)"
        )
    if not os.path.isfile(path):
        pytest.fail(f"KUBE_SIM_BIN={path} does not exist")
    return path


def wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path: Path):
    kubeconfig = tmp_path / "kubeconfig"
    log = open(tmp_path / "kube-sim.log", "w")
    proc = subprocess.Popen(
        [kube_sim_bin(), "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        first_line: list[str] = []
        reader = threading.Thread(
            target=lambda: first_line.append(proc.stdout.readline()), daemon=True
        )
        reader.start()
        reader.join(timeout=30)
        line = first_line[0].strip() if first_line else ""
        if not line.startswith("listening on https://"):
            raise AssertionError(f"kube-sim did not start (first line {line!r})")
        # Keep reading so kube-sim never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        wait_for(kubeconfig.exists, "kube-sim's kubeconfig")
        # A fresh kube-sim is a fresh cluster: the chart creates its namespaces.
        yield Cluster(base=line.removeprefix("listening on "), kubeconfig=str(kubeconfig))
    finally:
        # SIGTERM lets kube-sim remove its sandbox directory; SIGKILL only if
        # it does not exit.
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


# --- reading back what landed --------------------------------------------------


def deployment(sim: Cluster) -> dict[str, Any]:
    return sim.must_get(f"/apis/apps/v1/namespaces/{RUNNER_NS}/deployments/{NAME}")


def runner_container(sim: Cluster) -> dict[str, Any]:
    containers = deployment(sim)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["runner"]
    return containers[0]


def env_values(sim: Cluster) -> dict[str, str]:
    """The runner's plain env values; a secretKeyRef shows as
    `secret:<name>/<key>`, a downward API fieldRef as `field:<path>`."""
    out: dict[str, str] = {}
    for var in runner_container(sim).get("env", []):
        assert var["name"] not in out, f"{var['name']} is set twice"
        if "valueFrom" in var and "fieldRef" in var["valueFrom"]:
            out[var["name"]] = f"field:{var['valueFrom']['fieldRef']['fieldPath']}"
        elif "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            out[var["name"]] = f"secret:{ref['name']}/{ref['key']}"
        else:
            out[var["name"]] = var["value"]
    return out


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    if "data" in secret:
        return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return dict(secret.get("stringData", {}))


def network_policy(sim: Cluster) -> dict[str, Any]:
    return sim.must_get(
        f"/apis/networking.k8s.io/v1/namespaces/{SESSION_NS}/networkpolicies/{NAME}-sessions"
    )


TLS_SECRET_PATH = f"/api/v1/namespaces/{SESSION_NS}/secrets/{NAME}-ingress-tls"


def default_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


# --- lint ----------------------------------------------------------------------


def lint(chart: Path) -> dict[str, Any]:
    config = helm_sdkpy.Configuration(namespace=RELEASE_NAMESPACE, plain_http=True)
    return asyncio.run(helm_sdkpy.Lint(config).run(str(chart)))


def assert_lint_clean(result: dict[str, Any]) -> None:
    # Helm's severities: 1 info, 2 warning, 3 error. Info is "icon is
    # recommended"; anything worse fails.
    assert result["TotalChartsLinted"] == 1
    assert not result.get("Errors"), result
    worse = [m for m in result.get("Messages") or [] if m["Severity"] > 1]
    assert not worse, worse


def test_lint_passes_with_the_default_values():
    assert_lint_clean(lint(CHART))


def test_lint_passes_with_every_optional_object_enabled(tmp_path: Path):
    chart = tmp_path / "telo-runner"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    values = default_values()
    values["metrics"]["serviceMonitor"].update(enabled=True, labels={"release": "prom"})
    values["runner"]["terms"]["enabled"] = True
    values["sessionRouting"].update(mode="ingress", baseDomain="run.example.com",
                                    dataPlaneNamespace="ingress-nginx")
    values["sessionRouting"]["ingress"].update(className="nginx")
    values["sessionRouting"]["ingress"]["tls"].update(cert=TLS_CERT, key=TLS_KEY)
    values["apps"]["catalog"] = {"hello": {"image": "ghcr.io/example/hello:1"}}
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    assert_lint_clean(lint(chart))


def test_the_chart_is_named_and_versioned_for_the_runner():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["name"] == "telo-runner"
    assert meta["version"] == "0.1.0"
    assert meta["appVersion"] == "0.1.0"
    assert meta["type"] == "application"


# --- installs --------------------------------------------------------------------


def test_default_install_creates_the_runner_and_its_fenced_session_namespace(cluster):
    release = cluster.install()
    assert release["info"]["status"] == "deployed"
    assert "ServiceMonitor" not in release["manifest"]

    deploy = deployment(cluster)
    spec = deploy["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/name": NAME}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    runner = runner_container(cluster)
    assert runner["image"] == "telo-runner:0.1.0"
    assert runner["args"] == ["serve"]
    assert runner["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert runner["ports"] == [{"name": "http", "containerPort": 8062, "protocol": "TCP"}]
    assert runner["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert runner["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert runner["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}, PEER_TOKEN_MOUNT]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}, peer_token_volume()]
    assert env_values(cluster) == DEFAULT_ENV

    service = cluster.must_get(f"/api/v1/namespaces/{RUNNER_NS}/services/{NAME}")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": NAME}
    [port] = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("http", 8062, "http")

    runner_ns = cluster.must_get(f"/api/v1/namespaces/{RUNNER_NS}")
    assert "pod-security.kubernetes.io/enforce" not in runner_ns["metadata"]["labels"]
    session_ns = cluster.must_get(f"/api/v1/namespaces/{SESSION_NS}")
    labels = session_ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"

    quota = cluster.must_get(f"/api/v1/namespaces/{SESSION_NS}/resourcequotas/{NAME}-sessions")
    assert quota["spec"]["hard"] == {
        "pods": "32",
        "limits.cpu": "16",
        "limits.memory": "16Gi",
        "requests.cpu": "16",
        "requests.memory": "16Gi",
    }

    policy = network_policy(cluster)["spec"]
    assert policy["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/managed-by": "telo-k8s-runner"}
    }
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [
        {"from": [{"namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": RUNNER_NS}}}]}
    ]
    dns, to_runner, internet = policy["egress"]
    assert dns["to"] == [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]
    assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [
        ("TCP", 53), ("UDP", 53)]
    assert to_runner == {"to": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": RUNNER_NS}}}]}
    assert internet == {"to": [{"ipBlock": {
        "cidr": "0.0.0.0/0",
        "except": ["169.254.169.254/32", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"],
    }}]}

    assert cluster.get(TLS_SECRET_PATH) is None
    assert cluster.get(f"/api/v1/namespaces/{RUNNER_NS}/configmaps/{NAME}-terms") is None


def test_rbac_grants_only_the_verbs_the_runner_uses(cluster):
    cluster.install()
    account = cluster.must_get(f"/api/v1/namespaces/{RUNNER_NS}/serviceaccounts/{NAME}")
    assert account["metadata"]["name"] == NAME
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": RUNNER_NS}]

    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = cluster.must_get(f"{rbac}/namespaces/{SESSION_NS}/roles/{NAME}")
    assert role["rules"] == SESSION_ROLE_RULES
    binding = cluster.must_get(f"{rbac}/namespaces/{SESSION_NS}/rolebindings/{NAME}")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME}
    assert binding["subjects"] == subject

    cluster_role = cluster.must_get(f"{rbac}/clusterroles/{PROBE_CLUSTER_ROLE}")
    assert cluster_role["rules"] == PROBE_CLUSTER_ROLE_RULES
    cluster_binding = cluster.must_get(f"{rbac}/clusterrolebindings/{PROBE_CLUSTER_ROLE}")
    assert cluster_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
        "name": PROBE_CLUSTER_ROLE}
    assert cluster_binding["subjects"] == subject

    # In its own namespace, the replicas' Leases and nothing else.
    lease_role = cluster.must_get(f"{rbac}/namespaces/{RUNNER_NS}/roles/{LEASE_ROLE}")
    assert lease_role["rules"] == LEASE_ROLE_RULES
    lease_binding = cluster.must_get(f"{rbac}/namespaces/{RUNNER_NS}/rolebindings/{LEASE_ROLE}")
    assert lease_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEASE_ROLE}
    assert lease_binding["subjects"] == subject

    # Nothing else: no Role or ClusterRole beyond these three.
    roles = cluster.must_get(f"{rbac}/roles")["items"]
    assert sorted((r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles) == [
        (RUNNER_NS, LEASE_ROLE), (SESSION_NS, NAME)]
    ours = [c["metadata"]["name"] for c in cluster.must_get(f"{rbac}/clusterroles")["items"]
            if c["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == RELEASE]
    assert ours == [PROBE_CLUSTER_ROLE]


def test_watch_sessions_add_only_the_secrets_their_checkpoints_need(cluster):
    cluster.install({"watch": {"enabled": True}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = cluster.must_get(f"{rbac}/namespaces/{SESSION_NS}/roles/{NAME}")
    assert role["rules"] == SESSION_ROLE_RULES + [SECRETS_RULE]
    env = env_values(cluster)
    assert env["RUNNER_WATCH_SESSIONS"] == "true"
    assert env["RUNNER_WATCH_IDLE_SECONDS"] == "300"
    assert env["RUNNER_WORKSPACE_IMAGE"] == runner_container(cluster)["image"]


@pytest.mark.parametrize(
    "apps",
    [{"catalog": CATALOG_FOR_RBAC}, {"catalogSecret": "telo-apps"}],
    ids=["inline", "secret"],
)
def test_an_app_catalog_adds_the_secrets_its_pods_env_needs(cluster, apps):
    # A catalog app's (or agent's) env goes into a Secret per pod, never
    # into the pod spec: the runner creates, ties (patch), sweeps (list)
    # and deletes them.
    cluster.install({"apps": apps})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = cluster.must_get(f"{rbac}/namespaces/{SESSION_NS}/roles/{NAME}")
    assert role["rules"] == SESSION_ROLE_RULES + [SECRETS_RULE]


def test_every_runner_setting_reaches_the_deployment(cluster):
    cluster.install({
        "image": {"repository": "registry.example.com/telo-runner", "tag": "dev",
                  "pullPolicy": "Always"},
        "runner": {
            "port": 9000, "logLevel": "debug", "displayName": "Acme runner",
            "description": "Runs Acme apps", "maxSessions": 5,
            "managedBy": "acme-runner", "orphanPolicy": "reap",
            "startDeadlineSeconds": 45, "corsOrigins": "https://editor.example.com",
            "maxConnections": 2000, "maxConnectionsPerClient": 100,
            "trustedProxies": "10.0.0.0/8,fd00::/8",
            "appLimits": {"maxCpu": "2", "maxMemory": "2Gi", "maxTtlSeconds": 86400,
                          "maxEphemeralStorage": "4Gi"},
            "extraEnv": [{"name": "RUNNER_MAX_BODY_BYTES", "value": "4194304"}],
        },
        "limits": {"maxCpu": "1", "maxMemory": "1Gi", "maxTtlSeconds": 7200,
                   "maxEphemeralStorage": "2Gi"},
        "session": {
            "image": "telorun/node:1.2.3-slim", "initImage": "registry.example.com/busybox:1",
            "imagePullSecret": "regcred", "runtimeClass": "gvisor",
            "teloImages": {"repository": "registry.example.com/telo", "variant": "bookworm",
                           "unreleased": "registry.example.com/telo:dev",
                           "pullPolicy": "always"},
            "baseImages": {"repository": "acme/node", "pinnedOnly": False,
                           "excludeSha": False, "excludePrerelease": False,
                           "include": "^1\\.", "exclude": "-rc", "limit": 5,
                           "refreshSeconds": 600},
        },
        "sessionRouting": {"mode": "none", "routeReadyTimeoutSeconds": 90},
        "watch": {"enabled": True, "idleSeconds": 60, "maxTtlSeconds": 7200,
                  "maxSessions": 3, "reloadLimit": 10, "suspendedTtlSeconds": 3600,
                  "checkpointSeconds": 15},
    })
    runner = runner_container(cluster)
    assert runner["image"] == "registry.example.com/telo-runner:dev"
    assert runner["imagePullPolicy"] == "Always"
    assert runner["ports"][0]["containerPort"] == 9000
    assert env_values(cluster) == {
        **REPLICA_ENV,
        "RUNNER_LEASE_DURATION_SECONDS": "15",
        "RUNNER_BACKEND": "kubernetes",
        "PORT": "9000",
        "LOG_LEVEL": "debug",
        "LOG_FORMAT": "json",
        "RUNNER_SELF_URL": "http://telo-k8s-runner.telo-runner.svc:9000",
        "RUNNER_SESSION_NAMESPACE": "telo-sessions",
        "RUNNER_MANAGED_BY": "acme-runner",
        "RUNNER_ORPHAN_POLICY": "reap",
        "RUNNER_START_DEADLINE_SECONDS": "45",
        "RUNNER_MAX_SESSIONS": "5",
        "RUNNER_DISPLAY_NAME": "Acme runner",
        "RUNNER_DESCRIPTION": "Runs Acme apps",
        "RUNNER_CORS_ORIGINS": "https://editor.example.com",
        "RUNNER_MAX_CONNECTIONS": "2000",
        "RUNNER_MAX_CONNECTIONS_PER_CLIENT": "100",
        "RUNNER_TRUSTED_PROXIES": "10.0.0.0/8,fd00::/8",
        "RUNNER_IMAGE": "telorun/node:1.2.3-slim",
        "RUNNER_INIT_IMAGE": "registry.example.com/busybox:1",
        "RUNNER_WATCH_SESSIONS": "true",
        "RUNNER_WATCH_IDLE_SECONDS": "60",
        "RUNNER_WATCH_MAX_TTL_SECONDS": "7200",
        "RUNNER_WATCH_MAX_SESSIONS": "3",
        "RUNNER_WATCH_RELOAD_LIMIT": "10",
        "RUNNER_WATCH_SUSPENDED_TTL_SECONDS": "3600",
        "RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "15",
        "RUNNER_WORKSPACE_IMAGE": "registry.example.com/telo-runner:dev",
        "RUNNER_IMAGE_PULL_SECRET": "regcred",
        "RUNNER_RUNTIME_CLASS": "gvisor",
        "RUNNER_TELO_IMAGE_REPOSITORY": "registry.example.com/telo",
        "RUNNER_TELO_IMAGE_VARIANT": "bookworm",
        "RUNNER_TELO_UNRELEASED_IMAGE": "registry.example.com/telo:dev",
        "RUNNER_PULL_POLICY": "always",
        "RUNNER_MAX_CPU": "1",
        "RUNNER_MAX_MEMORY": "1Gi",
        "RUNNER_MAX_TTL_SECONDS": "7200",
        "RUNNER_MAX_EPHEMERAL_STORAGE": "2Gi",
        "RUNNER_APP_MAX_CPU": "2",
        "RUNNER_APP_MAX_MEMORY": "2Gi",
        "RUNNER_APP_MAX_TTL_SECONDS": "86400",
        "RUNNER_APP_MAX_EPHEMERAL_STORAGE": "4Gi",
        "RUNNER_BASE_IMAGE_CATALOG_ENABLED": "true",
        "RUNNER_BASE_IMAGE_REPO": "acme/node",
        "RUNNER_BASE_IMAGE_PINNED_ONLY": "false",
        "RUNNER_BASE_IMAGE_EXCLUDE_SHA": "false",
        "RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE": "false",
        "RUNNER_BASE_IMAGE_INCLUDE": "^1\\.",
        "RUNNER_BASE_IMAGE_EXCLUDE": "-rc",
        "RUNNER_BASE_IMAGE_LIMIT": "5",
        "RUNNER_BASE_IMAGE_REFRESH_SECONDS": "600",
        "SESSION_ROUTING_MODE": "none",
        "SESSION_ROUTE_READY_TIMEOUT_SECONDS": "90",
        "RUNNER_MAX_BODY_BYTES": "4194304",
    }
    # A custom managed-by value stays inside the session fence (the reference
    # chart hard-coded the default here, so such pods escaped the policy).
    assert network_policy(cluster)["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/managed-by": "acme-runner"}
    }
    service = cluster.must_get(f"/api/v1/namespaces/{RUNNER_NS}/services/{NAME}")
    assert service["spec"]["ports"][0]["port"] == 9000


def test_a_self_url_replaces_the_services_address_where_pods_reach_the_runner(cluster):
    cluster.install({"runner": {"selfUrl": "http://10.0.0.1:8062/"},
                     "sessionRouting": {"mode": "ingress", "baseDomain": "run.example.com",
                                        "ingress": {"nginxTokenAuth": True}}})
    env = env_values(cluster)
    assert env["RUNNER_SELF_URL"] == "http://10.0.0.1:8062"
    annotations = json.loads(env["SESSION_INGRESS_ANNOTATIONS"])
    assert annotations["nginx.ingress.kubernetes.io/auth-url"] == (
        "http://10.0.0.1:8062/internal/sessions/{sessionId}/access"
    )


def test_telo_image_values_are_rendered_only_when_set(cluster):
    cluster.install({"session": {"teloImages": {"unreleased": "registry.example.com/telo:dev"}}})
    env = env_values(cluster)
    assert env["RUNNER_TELO_UNRELEASED_IMAGE"] == "registry.example.com/telo:dev"
    for unset in ("RUNNER_TELO_IMAGE_REPOSITORY", "RUNNER_TELO_IMAGE_VARIANT",
                  "RUNNER_PULL_POLICY"):
        assert unset not in env, unset


def test_default_values_leave_the_telo_images_to_the_runner(cluster):
    cluster.install({})
    env = env_values(cluster)
    assert not [k for k in env if k.startswith("RUNNER_TELO_") or k == "RUNNER_PULL_POLICY"]


def test_a_disabled_base_image_catalog_sets_only_the_switch(cluster):
    cluster.install({"session": {"baseImages": {"enabled": False}}})
    env = env_values(cluster)
    assert env["RUNNER_BASE_IMAGE_CATALOG_ENABLED"] == "false"
    assert not [k for k in env if k.startswith("RUNNER_BASE_IMAGE_") and
                k != "RUNNER_BASE_IMAGE_CATALOG_ENABLED"]


def test_quota_and_network_policy_can_be_left_out(cluster):
    cluster.install({"resourceQuota": {"enabled": False}, "networkPolicy": {"enabled": False}})
    assert cluster.get(f"/api/v1/namespaces/{SESSION_NS}/resourcequotas/{NAME}-sessions") is None
    assert cluster.get(
        f"/apis/networking.k8s.io/v1/namespaces/{SESSION_NS}/networkpolicies/{NAME}-sessions"
    ) is None


GATEWAY_ROUTING = {
    "mode": "gateway",
    "baseDomain": "run.example.com",
    "dataPlaneNamespace": "envoy-gateway-system",
    "gateway": {"name": "public"},
}


@pytest.mark.parametrize(
    ("gateway", "expected"),
    [
        ({"name": "public"},
         {"SESSION_GATEWAY_NAME": "public", "SESSION_GATEWAY_NAMESPACE": SESSION_NS}),
        ({"name": "public", "namespace": "gateways", "sectionName": "https"},
         {"SESSION_GATEWAY_NAME": "public", "SESSION_GATEWAY_NAMESPACE": "gateways",
          "SESSION_GATEWAY_SECTION_NAME": "https"}),
    ],
    ids=["gateway-in-session-namespace", "gateway-elsewhere-with-listener"],
)
def test_gateway_routing_names_the_gateway_and_admits_its_data_plane(cluster, gateway, expected):
    routing = {**GATEWAY_ROUTING, "gateway": gateway}
    cluster.install({"sessionRouting": routing})
    env = env_values(cluster)
    routing_env = {k: v for k, v in env.items() if k.startswith("SESSION_")}
    assert routing_env == {
        "SESSION_ROUTING_MODE": "gateway",
        "SESSION_ROUTE_READY_TIMEOUT_SECONDS": "60",
        "SESSION_ROUTING_BASE_DOMAIN": "run.example.com",
        **expected,
    }
    ingress = network_policy(cluster)["spec"]["ingress"]
    assert ingress[1] == {"from": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}}}]}
    assert cluster.get(TLS_SECRET_PATH) is None


@pytest.mark.parametrize(
    "routing",
    [
        {**GATEWAY_ROUTING},
        # auto with a Gateway named resolves to the Gateway too.
        {**GATEWAY_ROUTING, "mode": "auto"},
    ],
    ids=["gateway", "auto-with-gateway"],
)
def test_under_gateway_api_no_ingress_tls_secret_is_made_or_passed(cluster, routing):
    routing = copy.deepcopy(routing)
    routing["ingress"] = {"tls": {"cert": TLS_CERT, "key": TLS_KEY}}
    cluster.install({"sessionRouting": routing})
    assert "SESSION_INGRESS_TLS_SECRET" not in env_values(cluster)
    assert cluster.get(TLS_SECRET_PATH) is None


def test_ingress_routing_with_a_certificate_stores_it_as_the_session_tls_secret(cluster):
    cluster.install({"sessionRouting": {
        "mode": "ingress",
        "baseDomain": "run.example.com",
        "dataPlaneNamespace": "ingress-nginx",
        "ingress": {"className": "nginx", "tls": {"cert": TLS_CERT, "key": TLS_KEY}},
    }})
    env = env_values(cluster)
    assert {k: v for k, v in env.items() if k.startswith("SESSION_")} == {
        "SESSION_ROUTING_MODE": "ingress",
        "SESSION_ROUTE_READY_TIMEOUT_SECONDS": "60",
        "SESSION_ROUTING_BASE_DOMAIN": "run.example.com",
        "SESSION_INGRESS_CLASS": "nginx",
        "SESSION_INGRESS_TLS_SECRET": f"{NAME}-ingress-tls",
    }
    secret = cluster.must_get(TLS_SECRET_PATH)
    assert secret["type"] == "kubernetes.io/tls"
    assert secret_data(secret) == {"tls.crt": TLS_CERT, "tls.key": TLS_KEY}
    assert network_policy(cluster)["spec"]["ingress"][1] == {"from": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]}


def test_ingress_routing_with_an_existing_secret_only_names_it(cluster):
    cluster.install({"sessionRouting": {
        "mode": "ingress",
        "baseDomain": "run.example.com",
        "ingress": {"tls": {"secretName": "wildcard-run-example-com"}},
    }})
    env = env_values(cluster)
    assert env["SESSION_INGRESS_TLS_SECRET"] == "wildcard-run-example-com"
    assert "SESSION_INGRESS_CLASS" not in env
    assert cluster.get(TLS_SECRET_PATH) is None
    # Without a data plane namespace only the runner may reach sessions.
    assert len(network_policy(cluster)["spec"]["ingress"]) == 1


def test_session_ingress_annotations_and_the_nginx_token_check_reach_the_runner(cluster):
    cluster.install({"sessionRouting": {
        "mode": "ingress",
        "baseDomain": "run.example.com",
        "ingress": {
            "annotations": {"example.com/owner": "team-a"},
            "nginxTokenAuth": True,
        },
    }})
    annotations = json.loads(env_values(cluster)["SESSION_INGRESS_ANNOTATIONS"])
    assert annotations == {
        "example.com/owner": "team-a",
        "nginx.ingress.kubernetes.io/auth-url":
            f"http://{NAME}.{RUNNER_NS}.svc:8062/internal/sessions/{{sessionId}}/access",
    }


def test_without_ingress_annotations_none_are_passed(cluster):
    cluster.install({"sessionRouting": {"mode": "ingress", "baseDomain": "run.example.com"}})
    assert "SESSION_INGRESS_ANNOTATIONS" not in env_values(cluster)


def test_warm_pools_reach_the_runner_with_the_workspace_image(cluster):
    cluster.install({"warmPool": {"pools": {
        "telorun/node:latest-slim": 5, "telorun/node:0.96.0-slim": 2,
    }}})
    env = env_values(cluster)
    assert env["RUNNER_WARM_POOL"] == "telorun/node:0.96.0-slim=2,telorun/node:latest-slim=5"
    assert env["RUNNER_WARM_POOL_SURGE"] == "4"
    assert env["RUNNER_WORKSPACE_IMAGE"] == "telo-runner:0.1.0"
    assert env["RUNNER_WATCH_SESSIONS"] == "false"


def test_a_warm_pool_size_that_is_not_a_pod_count_is_refused(cluster):
    message = cluster.install_error({"warmPool": {"pools": {"telorun/node:latest-slim": "five"}}})
    assert "warmPool.pools.telorun/node:latest-slim must be a whole number of pods from 0 to 100" in message


def test_a_warm_pool_surge_reaches_the_runner(cluster):
    cluster.install({"warmPool": {"pools": {"telorun/node:latest-slim": 5}, "surge": 2}})
    assert env_values(cluster)["RUNNER_WARM_POOL_SURGE"] == "2"


def test_without_warm_pools_no_surge_is_passed(cluster):
    cluster.install({"warmPool": {"surge": 2}})
    assert "RUNNER_WARM_POOL_SURGE" not in env_values(cluster)
    assert "RUNNER_WARM_POOL_MODULES" not in env_values(cluster)


def test_warm_pool_modules_reach_the_runner(cluster):
    cluster.install({"warmPool": {"pools": {"telorun/node:latest-slim": 5}}})
    assert env_values(cluster)["RUNNER_WARM_POOL_MODULES"] == "http-server,run,console,javascript"


@pytest.mark.parametrize("modules,passed", [
    (["http-server", "kv-store-memory"], "http-server,kv-store-memory"),
    ([], "none"),
])
def test_warm_pool_modules_may_be_chosen_or_none(cluster, modules, passed):
    cluster.install({"warmPool": {"pools": {"telorun/node:latest-slim": 5}, "modules": modules}})
    assert env_values(cluster)["RUNNER_WARM_POOL_MODULES"] == passed


@pytest.mark.parametrize("modules,message", [
    ("http-server", "warmPool.modules must be a list of module names (got 'http-server')."),
    (["Http-Server"], "warmPool.modules must list module names: lowercase letters and digits, words joined by single dashes (got 'Http-Server')."),
    (["none"], "warmPool.modules must list module names: lowercase letters and digits, words joined by single dashes (got 'none')."),
    (["run", "run"], "warmPool.modules must name each module once."),
])
def test_warm_pool_modules_that_are_not_module_names_are_refused(cluster, modules, message):
    error = cluster.install_error({"warmPool": {"pools": {"telorun/node:latest-slim": 5}, "modules": modules}})
    assert message in error


@pytest.mark.parametrize("surge", [0, 101, 2.5, "two"])
def test_a_warm_pool_surge_that_is_not_a_pod_count_is_refused(cluster, surge):
    message = cluster.install_error({"warmPool": {"pools": {"telorun/node:latest-slim": 5}, "surge": surge}})
    assert f"warmPool.surge must be a whole number of pods from 1 to 100 (got '{surge}')." in message



def test_watch_pools_reach_the_runner_beside_run_pools(cluster):
    cluster.install({"watch": {"enabled": True}, "warmPool": {
        "pools": {"telorun/node:latest-slim": 5},
        "watch": {"telorun/node:latest-slim": 3, "telorun/node:0.96.0-slim": 1},
        "surge": 2,
    }})
    env = env_values(cluster)
    assert env["RUNNER_WARM_POOL"] == "telorun/node:latest-slim=5"
    assert env["RUNNER_WARM_POOL_WATCH"] == "telorun/node:0.96.0-slim=1,telorun/node:latest-slim=3"
    assert env["RUNNER_WARM_POOL_SURGE"] == "2"
    assert env["RUNNER_WORKSPACE_IMAGE"] == "telo-runner:0.1.0"


def test_watch_pools_alone_pass_the_surge_and_no_run_pool(cluster):
    cluster.install({"watch": {"enabled": True}, "warmPool": {"watch": {"telorun/node:latest-slim": 2}}})
    env = env_values(cluster)
    assert env["RUNNER_WARM_POOL_WATCH"] == "telorun/node:latest-slim=2"
    assert env["RUNNER_WARM_POOL_SURGE"] == "4"
    assert "RUNNER_WARM_POOL" not in env


def test_a_watch_pool_size_that_is_not_a_pod_count_is_refused(cluster):
    message = cluster.install_error({"watch": {"enabled": True}, "warmPool": {"watch": {"telorun/node:latest-slim": -1}}})
    assert "warmPool.watch.telorun/node:latest-slim must be a whole number of pods from 0 to 100 (got '-1')." in message


def test_a_watch_pool_without_watch_sessions_is_refused(cluster):
    message = cluster.install_error({"warmPool": {"watch": {"telorun/node:latest-slim": 2}}})
    assert "warmPool.watch.telorun/node:latest-slim needs watch.enabled: only watch sessions claim watch pods." in message


CATALOG = {"hello": {"image": "ghcr.io/example/hello:1", "title": "Hello"}}


@pytest.mark.parametrize(
    "catalog", [json.dumps(CATALOG), CATALOG], ids=["json-text", "map"]
)
def test_an_inline_app_catalog_becomes_runner_apps(cluster, catalog):
    cluster.install({"apps": {"catalog": catalog}})
    assert json.loads(env_values(cluster)["RUNNER_APPS"]) == CATALOG


def test_an_app_catalog_secret_wins_over_the_inline_catalog(cluster):
    cluster.install({"apps": {"catalog": json.dumps(CATALOG), "catalogSecret": "telo-apps",
                              "catalogSecretKey": "apps.json"}})
    assert env_values(cluster)["RUNNER_APPS"] == "secret:telo-apps/apps.json"


def test_no_app_catalog_leaves_runner_apps_unset(cluster):
    cluster.install()
    assert "RUNNER_APPS" not in env_values(cluster)


def test_access_values_mount_their_files_and_reach_the_runner(cluster):
    tiers = {"tiers": {"default": {"sessions": 4, "requestsPerMinute": 600}},
             "tenants": {"acme": "default"}}
    cluster.install({"runner": {"access": {
        "tokensSecret": "runner-tokens",
        "oidc": {"issuer": "https://id.example.com", "audience": "telo",
                 "jwksConfigMap": "issuer-keys", "tenantClaim": "org"},
        "adminGroup": "ops",
        "tiers": tiers,
        "auditLog": "stdout",
        "webhook": {"url": "https://hooks.example.com/telo", "secretName": "hook-key"},
    }}})
    env = env_values(cluster)
    for name, value in {
        "RUNNER_AUTH_TOKENS_FILE": "/etc/telo/tokens/tokens",
        "RUNNER_OIDC_ISSUER": "https://id.example.com",
        "RUNNER_OIDC_AUDIENCE": "telo",
        "RUNNER_OIDC_JWKS_FILE": "/etc/telo/jwks/jwks.json",
        "RUNNER_OIDC_TENANT_CLAIM": "org",
        "RUNNER_OIDC_GROUPS_CLAIM": "groups",
        "RUNNER_ADMIN_GROUP": "ops",
        "RUNNER_TIERS_FILE": "/etc/telo/tiers/tiers.yaml",
        "RUNNER_AUDIT_LOG": "stdout",
        "RUNNER_WEBHOOK_URL": "https://hooks.example.com/telo",
        "RUNNER_WEBHOOK_SECRET_FILE": "/etc/telo/webhook/secret",
    }.items():
        assert env[name] == value, name
    assert "RUNNER_OIDC_JWKS_URL" not in env
    assert "RUNNER_ANONYMOUS" not in env
    config_map = cluster.must_get(f"/api/v1/namespaces/{RUNNER_NS}/configmaps/{NAME}-tiers")
    assert yaml.safe_load(config_map["data"]["tiers.yaml"]) == tiers
    volumes = {v["name"]: v for v in deployment(cluster)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tokens"]["secret"] == {
        "secretName": "runner-tokens", "items": [{"key": "tokens", "path": "tokens"}]}
    assert volumes["jwks"]["configMap"] == {"name": "issuer-keys"}
    assert volumes["tiers"]["configMap"] == {"name": f"{NAME}-tiers"}
    assert volumes["webhook"]["secret"] == {
        "secretName": "hook-key", "items": [{"key": "secret", "path": "secret"}]}
    mounts = {m["name"]: m for m in runner_container(cluster)["volumeMounts"]}
    for name in ("tokens", "jwks", "tiers", "webhook"):
        assert mounts[name]["readOnly"] is True, name


def test_default_values_leave_the_runner_unauthenticated_and_unlimited(cluster):
    cluster.install({})
    env = env_values(cluster)
    assert not [k for k in env if k.startswith(("RUNNER_OIDC_", "RUNNER_WEBHOOK_"))
                or k in ("RUNNER_AUTH_TOKENS_FILE", "RUNNER_TIERS_FILE", "RUNNER_ANONYMOUS",
                         "RUNNER_AUDIT_LOG", "RUNNER_ADMIN_GROUP")]


def test_terms_are_mounted_from_their_config_map(cluster):
    body = "Be nice.\n\n- **Really.**\n"
    cluster.install({"runner": {"terms": {
        "enabled": True, "title": "House rules", "version": "2024-01", "body": body}}})
    config_map = cluster.must_get(f"/api/v1/namespaces/{RUNNER_NS}/configmaps/{NAME}-terms")
    assert config_map["data"] == {"terms.md": body}

    env = env_values(cluster)
    assert env["RUNNER_TERMS_FILE"] == "/etc/telo/terms/terms.md"
    assert env["RUNNER_TERMS_TITLE"] == "House rules"
    assert env["RUNNER_TERMS_VERSION"] == "2024-01"
    runner = runner_container(cluster)
    assert {"name": "terms", "mountPath": "/etc/telo/terms", "readOnly": True} in (
        runner["volumeMounts"])
    template = deployment(cluster)["spec"]["template"]
    assert {"name": "terms", "configMap": {"name": f"{NAME}-terms"}} in (
        template["spec"]["volumes"])
    assert "checksum/terms" in template["metadata"]["annotations"]


def test_default_terms_have_a_title_and_leave_the_version_to_the_runner(cluster):
    cluster.install({"runner": {"terms": {"enabled": True}}})
    env = env_values(cluster)
    assert env["RUNNER_TERMS_TITLE"] == "Before you run"
    assert "RUNNER_TERMS_VERSION" not in env
    body = cluster.must_get(f"/api/v1/namespaces/{RUNNER_NS}/configmaps/{NAME}-terms")
    assert body["data"]["terms.md"] == default_values()["runner"]["terms"]["body"]


def test_the_readme_install_lands_in_a_fresh_cluster_and_says_what_it_installed(cluster):
    # README "Install with Helm": helm install telo-runner ./chart
    #   --set image.repository=registry.example.com/telo-runner
    release = cluster.install({"image": {"repository": "registry.example.com/telo-runner"}})
    assert release["info"]["status"] == "deployed"
    notes = release["info"]["notes"]
    assert f"Runner     Deployment and Service {NAME} in namespace {RUNNER_NS}, port 8062" in notes
    assert "image registry.example.com/telo-runner:" in notes
    assert f"Sessions   pods in namespace {SESSION_NS} (created by this chart" in notes
    assert "none: sessions are logs-only" in notes
    assert f"kubectl -n {RUNNER_NS} port-forward service/{NAME} 8062:8062" in notes
    assert "telo-runner run --runner http://127.0.0.1:8062 <application directory>" in notes
    assert "{{" not in notes and "<no value>" not in notes
    deployment(cluster)


def test_the_notes_follow_the_values(cluster):
    release = cluster.install({
        "createNamespaces": True,
        "sessionRouting": {"mode": "ingress", "baseDomain": "run.example.com",
                           "ingress": {"className": "nginx"},
                           "dataPlaneNamespace": "ingress-nginx"},
        "runner": {"terms": {"enabled": True}, "orphanPolicy": "reap"},
        "resourceQuota": {"enabled": False},
    })
    notes = release["info"]["notes"]
    assert "session ports get hosts under run.example.com (mode ingress)" in notes
    assert f"reached only from {RUNNER_NS} and ingress-nginx" in notes
    assert "a restarted runner will reap the session pods it finds" in notes
    assert 'clients must accept "Before you run" before their first session' in notes
    assert "ResourceQuota" not in notes
    assert "<no value>" not in notes


def test_namespaces_are_left_alone_when_managed_elsewhere(cluster):
    for ns in (RUNNER_NS, SESSION_NS):
        req = cluster.request("/api/v1/namespaces", "POST",
                              {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        cluster.open(req).close()
    release = cluster.install({"createNamespaces": False})
    assert "kind: Namespace" not in release["manifest"]
    labels = cluster.must_get(f"/api/v1/namespaces/{SESSION_NS}")["metadata"].get("labels", {})
    assert "app.kubernetes.io/managed-by" not in labels
    deployment(cluster)


# --- refusals --------------------------------------------------------------------


def test_the_plain_install_puts_the_runner_in_the_current_namespace(cluster):
    # `helm install telo-runner ./chart`, with `default` as the current namespace.
    release = cluster.install(namespace="default", create_namespace=False)
    assert release["info"]["status"] == "deployed"
    assert cluster.must_get(f"/apis/apps/v1/namespaces/default/deployments/{NAME}")
    env = {e["name"]: e.get("value") for e in cluster.must_get(
        f"/apis/apps/v1/namespaces/default/deployments/{NAME}"
    )["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RUNNER_SELF_URL"] == f"http://{NAME}.default.svc:8062"
    assert cluster.must_get(f"/api/v1/namespaces/{SESSION_NS}")
    binding = cluster.must_get(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{SESSION_NS}/rolebindings/{NAME}"
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": NAME, "namespace": "default"}
    ]


def test_an_existing_session_namespace_is_used_as_it_is(cluster):
    request = cluster.request(
        "/api/v1/namespaces", "POST",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SESSION_NS}},
    )
    cluster.open(request).close()
    release = cluster.install()
    assert release["info"]["status"] == "deployed"
    assert "kind: Namespace" not in release["manifest"]
    assert cluster.must_get(f"/api/v1/namespaces/{SESSION_NS}/resourcequotas/{NAME}-sessions")


def test_the_old_runner_namespace_value_is_refused_with_the_way_forward(cluster):
    message = cluster.install_error({"runnerNamespace": "elsewhere"})
    assert "runnerNamespace is gone: the runner lives in the release's namespace" in message


def test_old_session_ingress_values_are_refused_with_the_way_forward(cluster):
    message = cluster.install_error({"sessionIngress": {"baseDomain": "run.example.com"}})
    assert OLD_KEYS_MESSAGE in message
    assert cluster.get(f"/apis/apps/v1/namespaces/{RUNNER_NS}/deployments/{NAME}") is None


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"sessionRouting": {"mode": "Gateway"}},
         "sessionRouting.mode must be one of auto, ingress, gateway, none (got 'Gateway')."),
        ({"sessionRouting": {"mode": "gateway"}},
         "sessionRouting.mode=gateway needs sessionRouting.gateway.name"),
        ({"sessionRouting": {"ingress": {"tls": {"cert": TLS_CERT}}}},
         "sessionRouting.ingress.tls needs both cert and key"),
        ({"runner": {"orphanPolicy": "keep"}},
         "runner.orphanPolicy must be adopt or reap (got 'keep')."),
        ({"apps": {"catalogSecret": "apps", "catalogSecretKey": ""}},
         "apps.catalogSecret is set but apps.catalogSecretKey is empty"),
        ({"session": {"teloImages": {"pullPolicy": "IfNotPresent"}}},
         "session.teloImages.pullPolicy must be one of missing, always, never "
         "(got 'IfNotPresent')."),
        ({"sessionRouting": {"mode": "gateway", "gateway": {"name": "public"},
                             "ingress": {"nginxTokenAuth": True}}},
         "sessionRouting.ingress.annotations and nginxTokenAuth apply to session Ingresses"),
        ({"runner": {"access": {"anonymous": True, "tokensSecret": "t"}}},
         "runner.access.anonymous turns authentication off"),
        ({"runner": {"access": {"oidc": {"issuer": "https://id.example.com",
                                         "jwksUrl": "https://id.example.com/jwks"}}}},
         "runner.access.oidc.issuer needs runner.access.oidc.audience"),
        ({"runner": {"access": {"tiers": {"tiers": {"default": {"sessions": 1}}}}}},
         "runner.access.tiers apply to principals"),
        ({"runner": {"access": {"webhook": {"url": "https://hooks.example.com"}}}},
         "runner.access.webhook.url needs runner.access.webhook.secretName"),
        ({"runner": {"access": {"auditLog": "/var/log/audit.log"}}},
         "runner.access.auditLog must be stdout or empty"),
    ],
    ids=["mode-typo", "gateway-without-name", "cert-without-key", "orphan-policy",
         "secret-without-key", "telo-pull-policy", "ingress-auth-under-gateway",
         "anonymous-beside-tokens", "oidc-without-audience", "tiers-without-principals",
         "webhook-without-secret", "audit-file"],
)
def test_values_the_runner_would_refuse_are_refused_at_install(cluster, values, fragment):
    assert fragment in cluster.install_error(values)
    assert cluster.get(f"/apis/apps/v1/namespaces/{RUNNER_NS}/deployments/{NAME}") is None


PREVIEW = {"baseUrl": "https://run.example.com",
           "ingress": {"enabled": True, "className": "nginx",
                       "tlsSecretName": "wildcard-tls",
                       "annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"}}}
PREVIEW_KEY_PATH = f"/api/v1/namespaces/{RUNNER_NS}/secrets/{NAME}-preview-key"


def test_the_session_edge_reaches_the_runner_with_a_key_kept_across_upgrades(cluster):
    cluster.install({"preview": PREVIEW})
    env = env_values(cluster)
    for name, value in {
        "RUNNER_PREVIEW_BASE_URL": "https://run.example.com",
        "RUNNER_PREVIEW_ACCESS": "private",
        "RUNNER_PREVIEW_SIGNING_KEY_FILE": "/etc/telo/preview/signing-key",
        "RUNNER_PREVIEW_GRANT_TTL_SECONDS": "43200",
        "RUNNER_PREVIEW_WAKE_TIMEOUT_SECONDS": "30",
        "SESSION_ROUTING_MODE": "auto",
    }.items():
        assert env[name] == value, name
    key = secret_data(cluster.must_get(PREVIEW_KEY_PATH))["signing-key"]
    assert len(key) >= 32
    volumes = {v["name"]: v for v in deployment(cluster)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["preview-key"]["secret"] == {
        "secretName": f"{NAME}-preview-key",
        "items": [{"key": "signing-key", "path": "signing-key"}]}
    mounts = {m["name"]: m for m in runner_container(cluster)["volumeMounts"]}
    assert mounts["preview-key"] == {
        "name": "preview-key", "mountPath": "/etc/telo/preview", "readOnly": True}
    ingress = cluster.must_get(
        f"/apis/networking.k8s.io/v1/namespaces/{RUNNER_NS}/ingresses/{NAME}-preview")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["*.run.example.com"],
                                       "secretName": "wildcard-tls"}]
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "*.run.example.com"
    assert rule["http"]["paths"][0]["backend"] == {
        "service": {"name": NAME, "port": {"name": "http"}}}
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    # An upgrade keeps the key: grants and links made before it still open.
    cluster.upgrade({"preview": {**PREVIEW, "access": "public"}})
    assert env_values(cluster)["RUNNER_PREVIEW_ACCESS"] == "public"
    assert secret_data(cluster.must_get(PREVIEW_KEY_PATH))["signing-key"] == key


def test_an_operators_key_secret_is_only_named(cluster):
    cluster.install({"preview": {"baseUrl": "http://run.example.com:8080",
                                 "signingKeySecret": "edge-key", "signingKeySecretKey": "key"}})
    assert cluster.get(PREVIEW_KEY_PATH) is None
    volumes = {v["name"]: v for v in deployment(cluster)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["preview-key"]["secret"] == {
        "secretName": "edge-key", "items": [{"key": "key", "path": "signing-key"}]}
    assert cluster.get(
        f"/apis/networking.k8s.io/v1/namespaces/{RUNNER_NS}/ingresses/{NAME}-preview") is None


def test_without_a_preview_base_the_edge_is_off(cluster):
    cluster.install({})
    assert not [k for k in env_values(cluster) if k.startswith("RUNNER_PREVIEW_")]
    assert cluster.get(PREVIEW_KEY_PATH) is None


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"preview": {"access": "open"}},
         "preview.access must be public or private (got 'open')."),
        ({"preview": {"baseUrl": "run.example.com"}},
         "preview.baseUrl must be an absolute http:// or https:// URL"),
        ({"preview": {"baseUrl": "https://run.example.com/x"}},
         "preview.baseUrl must be an absolute http:// or https:// URL"),
        ({"preview": {"baseUrl": "https://run.example.com"},
          "sessionRouting": {"mode": "ingress", "baseDomain": "apps.example.com"}},
         "preview.baseUrl is set but so is sessionRouting.mode=ingress"),
        ({"preview": {"ingress": {"enabled": True}}},
         "preview.ingress.enabled needs preview.baseUrl"),
    ],
    ids=["access-typo", "no-scheme", "a-path", "beside-ingress-routing", "ingress-without-base"],
)
def test_preview_values_the_runner_would_refuse_are_refused_at_install(cluster, values, fragment):
    assert fragment in cluster.install_error(values)


def test_service_monitor_is_rendered_when_enabled(cluster):
    # kube-sim, like a cluster without the Prometheus Operator, does not serve
    # monitoring.coreos.com: Helm's refusal shows the object was rendered, with
    # its kind, version, name and namespace.
    message = cluster.install_error({"metrics": {"serviceMonitor": {"enabled": True}}})
    assert 'no matches for kind "ServiceMonitor" in version "monitoring.coreos.com/v1"' in message
    assert f'name: "{NAME}" namespace: "{RUNNER_NS}"' in message


# --- replicas --------------------------------------------------------------------


PEER_SECRET_PATH = f"/api/v1/namespaces/{RUNNER_NS}/secrets/{NAME}-peer-token"
PDB_PATH = f"/apis/policy/v1/namespaces/{RUNNER_NS}/poddisruptionbudgets/{NAME}"
PEER_TOKEN_MOUNT = {"name": "peer-token", "mountPath": "/etc/telo/peer", "readOnly": True}
SPREAD_OVER_NODES = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 100, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": NAME}}}}]}}


def peer_token_volume(secret: str = f"{NAME}-peer-token", key: str = "token") -> dict[str, Any]:
    return {"name": "peer-token",
            "secret": {"secretName": secret, "items": [{"key": key, "path": "token"}]}}


def peer_token(sim: Cluster) -> str:
    return secret_data(sim.must_get(PEER_SECRET_PATH))["token"]


def test_two_replicas_by_default_replaced_one_at_a_time_and_spread(cluster):
    release = cluster.install()
    spec = deployment(cluster)["spec"]
    assert spec["replicas"] == 2
    # An old replica stops only once its replacement answers /readyz.
    assert spec["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    readiness = runner_container(cluster)["readinessProbe"]
    assert readiness["httpGet"] == {"path": "/readyz", "port": "http"}
    assert readiness["periodSeconds"] <= 10
    assert spec["template"]["spec"]["affinity"] == SPREAD_OVER_NODES

    pdb = cluster.must_get(PDB_PATH)
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
    }
    # The budget covers exactly the runner's pods.
    labels = spec["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()

    env = env_values(cluster)
    for name, value in {**REPLICA_ENV, "RUNNER_LEASE_DURATION_SECONDS": "15"}.items():
        assert env[name] == value, name
    assert PEER_TOKEN_MOUNT in runner_container(cluster)["volumeMounts"]
    assert peer_token_volume() in spec["template"]["spec"]["volumes"]
    token = peer_token(cluster)
    assert len(token) == 48 and token.isalnum()

    notes = release["info"]["notes"]
    assert "2 replicas: rolling updates one at a time" in notes
    assert f"peer token in Secret {NAME}-peer-token (made by this chart" in notes


def test_the_peer_token_survives_upgrades_and_a_change_of_replica_count(cluster):
    cluster.install({"replicaCount": 1})
    token = peer_token(cluster)
    assert deployment(cluster)["spec"]["strategy"] == {"type": "Recreate"}

    cluster.upgrade({"replication": {"leaseDurationSeconds": 30}})
    assert peer_token(cluster) == token
    spec = deployment(cluster)["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert env_values(cluster)["RUNNER_LEASE_DURATION_SECONDS"] == "30"
    assert cluster.get(PDB_PATH) is not None

    cluster.upgrade({"replicaCount": 3})
    assert peer_token(cluster) == token
    assert deployment(cluster)["spec"]["replicas"] == 3

    # Back to one: Recreate again, without the rolling parameters (which an
    # apiserver refuses beside Recreate), and no budget.
    cluster.upgrade({"replicaCount": 1})
    assert peer_token(cluster) == token
    assert deployment(cluster)["spec"]["strategy"] == {"type": "Recreate"}
    assert cluster.get(PDB_PATH) is None


def test_an_existing_peer_secret_is_used_as_it_is(cluster):
    cluster.open(cluster.request("/api/v1/namespaces", "POST", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RUNNER_NS}})).close()
    own = {"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": "telo-peers", "namespace": RUNNER_NS},
           "data": {"shared": base64.b64encode(b"s" * 40).decode()}}
    cluster.open(cluster.request(f"/api/v1/namespaces/{RUNNER_NS}/secrets", "POST", own)).close()

    release = cluster.install({"replication": {"existingSecret": "telo-peers",
                                               "existingSecretKey": "shared"}})
    assert cluster.get(PEER_SECRET_PATH) is None
    # The release owns no Secret at all: the operator's stays theirs.
    objects = [d for d in yaml.safe_load_all(release["manifest"]) if d]
    assert not [d for d in objects if d["kind"] == "Secret"]
    volumes = deployment(cluster)["spec"]["template"]["spec"]["volumes"]
    assert peer_token_volume("telo-peers", "shared") in volumes
    assert env_values(cluster)["RUNNER_PEER_TOKEN_FILE"] == "/etc/telo/peer/token"
    secret = cluster.must_get(f"/api/v1/namespaces/{RUNNER_NS}/secrets/telo-peers")
    assert secret_data(secret) == {"shared": "s" * 40}
    assert "app.kubernetes.io/managed-by" not in secret["metadata"].get("labels", {})
    assert "peer token from Secret telo-peers" in release["info"]["notes"]


def test_a_single_replica_is_recreated_and_has_no_disruption_budget(cluster):
    release = cluster.install({"replicaCount": 1})
    spec = deployment(cluster)["spec"]
    assert spec["replicas"] == 1
    # Two runners never supervise the same pods: the old one is gone before
    # the new one adopts them.
    assert spec["strategy"] == {"type": "Recreate"}
    assert cluster.get(PDB_PATH) is None
    assert "PodDisruptionBudget" not in release["manifest"]
    # Still a replica like any: scaling up later needs no other change.
    env = env_values(cluster)
    for name, value in REPLICA_ENV.items():
        assert env[name] == value, name
    assert len(peer_token(cluster)) == 48
    assert "1 replica (Recreate" in release["info"]["notes"]


def test_affinity_replaces_the_default_spread(cluster):
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["runners"]}]}]}}}
    cluster.install({"affinity": affinity})
    assert deployment(cluster)["spec"]["template"]["spec"]["affinity"] == affinity


def test_the_session_fence_leaves_runner_replicas_free_to_call_each_other(cluster):
    # Peer calls go pod to pod on the runner's port. The chart's only
    # NetworkPolicy fences session pods; it must not select runner pods, and
    # nothing in the runner's namespace may restrict them.
    cluster.install()
    runner_labels = deployment(cluster)["spec"]["template"]["metadata"]["labels"]
    selector = network_policy(cluster)["spec"]["podSelector"]["matchLabels"]
    assert not selector.items() <= runner_labels.items()
    policies = cluster.must_get(
        f"/apis/networking.k8s.io/v1/namespaces/{RUNNER_NS}/networkpolicies")["items"]
    assert policies == []


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"replicaCount": 0}, "replicaCount must be a whole number of at least 1 (got '0')."),
        ({"replicaCount": 1.5}, "replicaCount must be a whole number of at least 1 (got '1.5')."),
        ({"replicaCount": "two"},
         "replicaCount must be a whole number of at least 1 (got 'two')."),
        ({"replication": {"leaseDurationSeconds": 0}},
         "replication.leaseDurationSeconds must be a whole number of seconds, at least 1"),
        ({"replication": {"existingSecret": "peers", "existingSecretKey": ""}},
         "replication.existingSecret is set but replication.existingSecretKey is empty"),
        ({"affinity": "spread"}, "affinity must be a map of pod affinity rules"),
    ],
    ids=["no-replicas", "half-a-replica", "words", "no-lease", "secret-without-key",
         "affinity-text"],
)
def test_replica_values_the_chart_cannot_use_are_refused(cluster, values, fragment):
    assert fragment in cluster.install_error(values)
    assert cluster.get(f"/apis/apps/v1/namespaces/{RUNNER_NS}/deployments/{NAME}") is None
