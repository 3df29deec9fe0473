//! The docker runtime (`Runtime::Docker`): pods run as real containers of a
//! docker engine, their securityContext and memory limit enforced by it.
//!
//! These tests need a running engine and the local images
//! `telo-runner/debian:bookworm` and `busybox:stable`; without them they
//! fail, saying how to get them (`scripts/engine.sh start`, then
//! `scripts/image.sh bases`). The docker client is
//! `TELO_RUNNER_CONTAINER_ENGINE`, else `docker`.
//!
//! The tests of the isolated pod network (a namespace per pod, held by an
//! infra container) also need root and iproute2, as `tests/podnet.rs`
//! does; where the machine does not allow it they say so and pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::{AsyncBufReadExt, SinkExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use kube::api::{Api, AttachParams, DeleteParams, ListParams, LogParams, PostParams, TerminalSize};
use kube_sim::{KubeSim, PodNetwork, Runtime, StartError};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt, AsyncWriteExt};

const BASE: &str = "telo-runner/debian:bookworm";
const BUSYBOX: &str = "busybox:stable";
/// Container start-up on a loaded 2-core machine takes a second or two.
const WAIT: Duration = Duration::from_secs(60);

fn client() -> String {
    std::env::var("TELO_RUNNER_CONTAINER_ENGINE")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "docker".into())
}

/// Runs the docker client; its stdout, or why it failed.
fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new(client())
        .args(args)
        .output()
        .map_err(|e| format!("could not run {}: {e}", client()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The engine answers and has the images, or the test fails saying how to
/// get them.
fn require_engine() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    let ready = READY.get_or_init(|| {
        docker(&["info", "--format", "{{.ServerVersion}}"]).map_err(|e| {
            format!(
                "no container engine answers ({} info: {e}). These tests run real containers: start one with `scripts/engine.sh start`, then build the images with `scripts/image.sh bases`",
                client()
            )
        })?;
        docker(&["image", "inspect", "--format", "{{.Id}}", BASE, BUSYBOX]).map_err(|e| {
            format!(
                "the local images {BASE} and {BUSYBOX} are missing ({e}): build them with `scripts/image.sh bases`"
            )
        })?;
        Ok(())
    });
    if let Err(e) = ready {
        panic!("{e}");
    }
}

/// The label of a pod's own containers, not its infra container.
const APP_CONTAINER: &str = "io.kubernetes.docker.type=container";
/// The label of a pod's infra container (isolated pod network).
const INFRA_CONTAINER: &str = "io.kubernetes.docker.type=podsandbox";

async fn docker_sim() -> KubeSim {
    require_engine();
    support::builder()
        .runtime(Runtime::Docker)
        .start()
        .await
        .expect("kube-sim starts with the docker runtime")
}

/// The ids of every container (running or not) with all these labels.
fn containers_labelled(labels: &[&str]) -> Vec<String> {
    let mut args = vec!["ps", "--all", "--quiet"];
    let filters: Vec<String> = labels.iter().map(|l| format!("label={l}")).collect();
    for f in &filters {
        args.extend(["--filter", f.as_str()]);
    }
    docker(&args)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

async fn create(sim: &KubeSim, pod: Value) -> (Api<Pod>, String) {
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    (pods, created.metadata.uid.unwrap())
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn main_status(p: &Pod) -> Option<&ContainerStatus> {
    p.status.as_ref()?.container_statuses.as_ref()?.first()
}

async fn finished(sim: &KubeSim, name: &str) -> Pod {
    sim.wait_for::<Pod>(
        "default",
        name,
        |p| matches!(phase(p), "Succeeded" | "Failed"),
        WAIT,
    )
    .await
    .unwrap()
}

async fn log(pods: &Api<Pod>, pod: &str, container: &str) -> String {
    pods.logs(
        pod,
        &LogParams {
            container: Some(container.into()),
            ..LogParams::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn the_runners_hardened_shape_is_enforced_by_the_engine() {
    let sim = docker_sim().await;
    // One stream, so the log keeps the order the lines were written in.
    let script = "exec 2>&1; id; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; \
        touch /x && echo 'root filesystem writable'; \
        echo ok > /work/ok && echo 'wrote /work/ok'; \
        chown root /work/ok && echo 'chown succeeded'; \
        mknod /work/null c 1 3 && echo 'mknod succeeded'; \
        stat -c 'work %A %g' /work; stat -c 'ok %u %g' /work/ok; true";
    let (pods, _) = create(
        &sim,
        json!({
            "metadata": {"name": "hardened"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000,
                    "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "c", "image": BASE, "command": ["sh", "-c", script],
                    "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
                "volumes": [{"name": "work", "emptyDir": {}}]
            }
        }),
    )
    .await;
    let done = finished(&sim, "hardened").await;
    let out = log(&pods, "hardened", "c").await;
    assert_eq!(phase(&done), "Succeeded", "{out}");
    for line in [
        "uid=1000 gid=1000 groups=1000\n",
        "CapEff:\t0000000000000000\n",
        "NoNewPrivs:\t1\n",
        "Seccomp:\t2\n",
        "touch: cannot touch '/x': Read-only file system\n",
        "wrote /work/ok\n",
        "chown: changing ownership of '/work/ok': Operation not permitted\n",
        "mknod: /work/null: Operation not permitted\n",
        // The emptyDir as the kubelet leaves it for fsGroup 1000.
        "work drwxrwsrwx 1000\n",
        "ok 1000 1000\n",
    ] {
        assert!(out.contains(line), "{line:?} missing from the log:\n{out}");
    }
    for line in [
        "root filesystem writable",
        "chown succeeded",
        "mknod succeeded",
    ] {
        assert!(!out.contains(line), "{line:?} in the log:\n{out}");
    }
    let cs = main_status(&done).unwrap();
    assert!(
        cs.container_id.as_deref().unwrap().starts_with("docker://"),
        "{cs:?}"
    );
    assert!(cs.image_id.starts_with("sha256:"), "{cs:?}");
}

#[tokio::test]
async fn run_as_non_root_refuses_a_root_image_and_starts_nothing() {
    let sim = docker_sim().await;
    let (_, uid) = create(
        &sim,
        json!({
            "metadata": {"name": "rooted"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": true},
                "containers": [{"name": "c", "image": BUSYBOX, "command": ["sh", "-c", "echo ran"]}]
            }
        }),
    )
    .await;
    let refused = sim
        .wait_for::<Pod>(
            "default",
            "rooted",
            |p| {
                main_status(p)
                    .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                    .as_deref()
                    == Some("CreateContainerConfigError")
            },
            WAIT,
        )
        .await
        .unwrap();
    let waiting = main_status(&refused)
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(
        waiting.message.unwrap(),
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"rooted_default({uid})\", container: c)"
        )
    );
    assert_eq!(phase(&refused), "Pending");
    let label = sim.container_label().unwrap();
    let pod_label = format!("io.kubernetes.pod.uid={uid}");
    assert!(containers_labelled(&[&label, &pod_label, APP_CONTAINER]).is_empty());
}

/// A real container's env takes a Secret's value as stored (never
/// expanded), and a container whose Secret is missing waits on
/// `CreateContainerConfigError` with the kubelet's message, no container
/// created, until the Secret exists.
#[tokio::test]
async fn secret_key_refs_resolve_for_a_real_container_and_a_missing_secret_holds_it() {
    let sim = docker_sim().await;
    let (pods, uid) = create(
        &sim,
        json!({
            "metadata": {"name": "keyed"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": BUSYBOX,
                    "command": ["sh", "-c", "echo \"$KEY|${OPT-unset}\""],
                    "env": [
                        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}},
                        {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": true}}},
                    ]}]
            }
        }),
    )
    .await;
    let held = sim
        .wait_for::<Pod>(
            "default",
            "keyed",
            |p| {
                main_status(p)
                    .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                    .as_deref()
                    == Some("CreateContainerConfigError")
            },
            WAIT,
        )
        .await
        .unwrap();
    let waiting = main_status(&held)
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(waiting.message.unwrap(), "secret \"creds\" not found");
    let label = sim.container_label().unwrap();
    let pod_label = format!("io.kubernetes.pod.uid={uid}");
    assert!(
        containers_labelled(&[&label, &pod_label, APP_CONTAINER]).is_empty(),
        "a container was created without its environment"
    );
    sim.seed_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds"},
        // "pa$$ $(HOME)"
        "data": {"k": "cGEkJCAkKEhPTUUp"},
    }))
    .unwrap();
    let done = finished(&sim, "keyed").await;
    assert_eq!(phase(&done), "Succeeded");
    assert_eq!(log(&pods, "keyed", "c").await, "pa$$ $(HOME)|unset\n");
}

#[tokio::test]
async fn a_container_over_its_memory_limit_is_oom_killed() {
    let sim = docker_sim().await;
    create(
        &sim,
        json!({
            "metadata": {"name": "greedy"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": BUSYBOX,
                    // A 64 MiB buffer, touched at once, in a 32 MiB cgroup.
                    "command": ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"],
                    "resources": {"limits": {"memory": "32Mi", "cpu": "500m"}}}]
            }
        }),
    )
    .await;
    let done = finished(&sim, "greedy").await;
    assert_eq!(phase(&done), "Failed");
    let term = main_status(&done)
        .unwrap()
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
}

#[tokio::test]
async fn init_containers_run_first_and_share_the_pods_volumes() {
    let sim = docker_sim().await;
    sim.seed_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "default"}, "data": {"greeting": "hello"}}))
        .unwrap();
    let (pods, _) = create(
        &sim,
        json!({
            "metadata": {"name": "shared"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
                "initContainers": [{"name": "write", "image": BUSYBOX,
                    "command": ["sh", "-c", "echo from-init > /data/msg && echo nested > /sub/file"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"},
                        {"name": "data", "mountPath": "/sub", "subPath": "nested"}]}],
                "containers": [{"name": "read", "image": BASE,
                    "command": ["sh", "-c", "exec 2>&1; cat /data/msg /data/nested/file /config/greeting; echo; \
                        (echo x > /data/msg) 2>/dev/null || echo read-only; \
                        (echo x > /config/greeting) 2>/dev/null || echo config read-only"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true},
                        {"name": "config", "mountPath": "/config"}]}],
                "volumes": [{"name": "data", "emptyDir": {}}, {"name": "config", "configMap": {"name": "cfg"}}]
            }
        }),
    )
    .await;
    let done = finished(&sim, "shared").await;
    let out = log(&pods, "shared", "read").await;
    assert_eq!(phase(&done), "Succeeded", "{out}");
    assert_eq!(
        out,
        "from-init\nnested\nhello\nread-only\nconfig read-only\n"
    );
    let st = done.status.unwrap();
    let init = st.init_container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    let main = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (init.exit_code, init.reason.as_deref()),
        (0, Some("Completed"))
    );
    assert!(init.finished_at.unwrap().0 <= main.started_at.unwrap().0);
}

#[tokio::test]
async fn a_tty_container_is_attached_resized_and_logged() {
    let sim = docker_sim().await;
    let script = "while read -r line; do echo \"got $line\"; \
        [ \"$line\" = size ] && stty size; [ \"$line\" = exit ] && exit 0; done";
    let (pods, _) = create(
        &sim,
        json!({
            "metadata": {"name": "tty"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "shell", "image": BUSYBOX, "command": ["sh", "-c", script],
                    "stdin": true, "tty": true}]
            }
        }),
    )
    .await;
    sim.wait_for::<Pod>("default", "tty", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let mut attached = pods
        .attach("tty", &AttachParams::interactive_tty().container("shell"))
        .await
        .unwrap();
    let mut stdin = attached.stdin().unwrap();
    let mut stdout = attached.stdout().unwrap();
    let mut resize = attached.terminal_size().unwrap();
    resize
        .send(TerminalSize {
            width: 120,
            height: 40,
        })
        .await
        .unwrap();
    // The client resizes the container's terminal on its own SIGWINCH: ask
    // until the new size shows.
    let mut seen = String::new();
    let mut buf = vec![0u8; 1024];
    let deadline = tokio::time::Instant::now() + WAIT;
    while !seen.contains("40 120") {
        stdin.write_all(b"size\r").await.unwrap();
        let read = tokio::time::timeout_at(deadline, stdout.read(&mut buf)).await;
        let n = read.expect("the new size in time").unwrap();
        assert!(n > 0, "stream ended: {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    // The container's own terminal echoes and answers with "\r\n".
    assert!(seen.contains("got size\r\n"), "{seen:?}");
    stdin.write_all(b"exit\r").await.unwrap();
    let status = tokio::time::timeout(WAIT, attached.take_status().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
    let done = finished(&sim, "tty").await;
    assert_eq!(phase(&done), "Succeeded");
    let out = log(&pods, "tty", "shell").await;
    assert!(out.contains("got size\r\n40 120\r\n"), "{out:?}");
    assert!(out.contains("got exit\r\n"), "{out:?}");
}

#[tokio::test]
async fn a_container_without_a_tty_is_attached_over_pipes() {
    let sim = docker_sim().await;
    let (pods, _) = create(
        &sim,
        json!({
            "metadata": {"name": "piped"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": BUSYBOX, "stdin": true,
                    "command": ["sh", "-c", "read -r line; echo \"got $line\"; echo oops >&2; exit 3"]}]
            }
        }),
    )
    .await;
    sim.wait_for::<Pod>("default", "piped", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let mut attached = pods
        .attach(
            "piped",
            &AttachParams::default()
                .container("c")
                .stdin(true)
                .stdout(true)
                .stderr(false),
        )
        .await
        .unwrap();
    let mut stdin = attached.stdin().unwrap();
    let mut stdout = attached.stdout().unwrap();
    stdin.write_all(b"ping\n").await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(WAIT, stdout.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..n], b"got ping\n");
    let done = finished(&sim, "piped").await;
    assert_eq!(phase(&done), "Failed");
    let term = main_status(&done)
        .unwrap()
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((term.exit_code, term.reason.as_deref()), (3, Some("Error")));
    // Both streams are in the log (their relative order is not kept: the
    // client writes them to two pipes).
    let out = log(&pods, "piped", "c").await;
    assert!(
        out == "got ping\noops\n" || out == "oops\ngot ping\n",
        "{out:?}"
    );
}

#[tokio::test]
async fn the_pod_ip_is_given_to_the_container_and_reaches_what_it_serves() {
    let sim = docker_sim().await;
    let port = test_support::free_port();
    // `$(POD_IP)` is expanded by the kubelet from the downward API.
    let script = format!(
        "mkdir -p /tmp/www && echo served-by-$(POD_IP) > /tmp/www/index.html && \
         httpd -p $(POD_IP):{port} -h /tmp/www && echo ready && exec sleep 3600"
    );
    let (pods, _) = create(
        &sim,
        json!({
            "metadata": {"name": "web"},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "web", "image": BUSYBOX, "command": ["sh", "-c", script],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]
            }
        }),
    )
    .await;
    let running = sim
        .wait_for::<Pod>("default", "web", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let ip = running.status.unwrap().pod_ip.unwrap();
    let mut lines = pods
        .log_stream(
            "web",
            &LogParams {
                follow: true,
                ..LogParams::default()
            },
        )
        .await
        .unwrap()
        .lines();
    let ready = tokio::time::timeout(WAIT, lines.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ready.as_deref(), Some("ready"));
    let body = reqwest::get(format!("http://{ip}:{port}/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, format!("served-by-{ip}\n"));
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    sim.wait_for_deletion("pods", "default", "web", WAIT)
        .await
        .unwrap();
}

#[tokio::test]
async fn deleting_a_pod_and_shutting_down_remove_every_container() {
    let sim = docker_sim().await;
    let label = sim.container_label().unwrap();
    let sleeper = |name: &str| {
        json!({
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": BUSYBOX, "command": ["sleep", "3600"]}]
            }
        })
    };
    let (pods, uid) = create(&sim, sleeper("doomed")).await;
    sim.wait_for::<Pod>("default", "doomed", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let pod_label = format!("io.kubernetes.pod.uid={uid}");
    assert_eq!(
        containers_labelled(&[&label, &pod_label, APP_CONTAINER]).len(),
        1
    );
    pods.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    sim.wait_for_deletion("pods", "default", "doomed", WAIT)
        .await
        .unwrap();
    assert!(
        containers_labelled(&[&label, &pod_label]).is_empty(),
        "the deleted pod's container (and infra container) is gone with it"
    );

    create(&sim, sleeper("left")).await;
    sim.wait_for::<Pod>("default", "left", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    assert_eq!(containers_labelled(&[&label, APP_CONTAINER]).len(), 1);
    sim.shutdown().await;
    assert!(
        containers_labelled(&[&label]).is_empty(),
        "shutdown leaves no container of the simulator"
    );
}

#[tokio::test]
async fn dropping_the_simulator_removes_its_containers_too() {
    let sim = docker_sim().await;
    let label = sim.container_label().unwrap();
    create(
        &sim,
        json!({
            "metadata": {"name": "orphan"},
            "spec": {"containers": [{"name": "c", "image": BUSYBOX, "command": ["sleep", "3600"]}]}
        }),
    )
    .await;
    sim.wait_for::<Pod>("default", "orphan", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    assert_eq!(containers_labelled(&[&label, APP_CONTAINER]).len(), 1);
    // The pod's container, and its infra container with an isolated pod
    // network.
    let made = containers_labelled(&[&label]).len();
    let since = docker(&["info", "--format", "{{.SystemTime}}"]).unwrap();
    // As when a test panics: no shutdown.
    drop(sim);
    let mut events = tokio::process::Command::new(client())
        .args(["events", "--format", "{{.Action}}", "--filter"])
        .arg(format!("label={label}"))
        .args(["--filter", "event=destroy", "--since", since.trim()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut destroyed = tokio::io::BufReader::new(events.stdout.take().unwrap()).lines();
    for _ in 0..made {
        let line = tokio::time::timeout(WAIT, destroyed.next_line())
            .await
            .expect("the containers are removed")
            .unwrap();
        assert_eq!(line.as_deref(), Some("destroy"));
    }
    assert!(containers_labelled(&[&label]).is_empty());
}

#[tokio::test]
async fn a_missing_local_image_fails_to_pull_like_an_unknown_one() {
    let sim = docker_sim().await;
    create(
        &sim,
        json!({
            "metadata": {"name": "ghost"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "telo-runner/never-built:1"}]
            }
        }),
    )
    .await;
    let pulled = sim
        .wait_for::<Pod>(
            "default",
            "ghost",
            |p| {
                main_status(p)
                    .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                    .is_some_and(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
            },
            WAIT,
        )
        .await
        .unwrap();
    let waiting = main_status(&pulled)
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    let full = "docker.io/telo-runner/never-built:1";
    assert!(waiting.message.unwrap().contains(&format!(
        "rpc error: code = NotFound desc = failed to pull and unpack image \"{full}\""
    )));
}

#[tokio::test]
async fn a_command_the_image_lacks_is_a_start_error() {
    let sim = docker_sim().await;
    let (_, uid) = create(
        &sim,
        json!({
            "metadata": {"name": "nocmd"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": BUSYBOX, "command": ["no-such-program"]}]
            }
        }),
    )
    .await;
    let done = finished(&sim, "nocmd").await;
    assert_eq!(phase(&done), "Failed");
    let cs = main_status(&done).unwrap();
    let term = cs.state.clone().unwrap().terminated.unwrap();
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (128, Some("StartError"))
    );
    let msg = term.message.unwrap();
    assert!(
        msg.starts_with("failed to create containerd task: ")
            && msg.contains("exec: \"no-such-program\": executable file not found in $PATH"),
        "{msg}"
    );
    assert!(!cs.started.unwrap_or(true));
    let label = sim.container_label().unwrap();
    let pod_label = format!("io.kubernetes.pod.uid={uid}");
    assert!(containers_labelled(&[&label, &pod_label, APP_CONTAINER]).is_empty());
    // It never ran: no `Started` event, as for containerd.
    let events = Api::<Event>::namespaced(sim.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    let reasons: Vec<&str> = events
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("nocmd"))
        .filter_map(|e| e.reason.as_deref())
        .collect();
    assert!(reasons.contains(&"Failed"), "{reasons:?}");
    assert!(!reasons.contains(&"Started"), "{reasons:?}");
}

// --- the isolated pod network of the docker runtime ---------------------------

/// A docker runtime simulator whose pods have a network each, or `None`
/// (with a note) where the machine does not allow it, as in
/// `tests/podnet.rs`; without an engine the test fails as every test here.
async fn isolated_docker_sim() -> Option<KubeSim> {
    require_engine();
    let started = support::builder()
        .runtime(Runtime::Docker)
        .pod_network(PodNetwork::Isolated)
        .start()
        .await;
    match started {
        Ok(sim) => Some(sim),
        Err(StartError::Network(e)) => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("kube-sim starts with the docker runtime: {e}"),
    }
}

/// A pod whose container serves `body` over HTTP on `<bind>:<port>`
/// (`bind` empty: every address), then says `ready`.
fn web_pod(name: &str, bind: &str, port: u16, body: &str) -> Value {
    let script = format!(
        "mkdir -p /tmp/www && echo {body} > /tmp/www/index.html && \
         httpd -p {bind}{port} -h /tmp/www && echo ready && exec sleep 3600"
    );
    json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "web", "image": BUSYBOX, "command": ["sh", "-c", script]}]
        }
    })
}

async fn pod_ip(sim: &KubeSim, name: &str) -> String {
    sim.wait_for::<Pod>("default", name, |p| phase(p) == "Running", WAIT)
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap()
}

async fn http_get(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn isolated_pods_listen_on_one_port_each_at_its_own_ip() {
    let Some(sim) = isolated_docker_sim().await else {
        return;
    };
    let port = test_support::free_port();
    for name in ["left", "right"] {
        create(&sim, web_pod(name, "", port, &format!("served-by-{name}"))).await;
    }
    for name in ["left", "right"] {
        support::until_logged_within(&sim, name, "ready", WAIT).await;
    }
    let (left, right) = (pod_ip(&sim, "left").await, pod_ip(&sim, "right").await);
    assert_ne!(left, right);
    assert!(
        support::is_pod_ip(&sim, &left) && support::is_pod_ip(&sim, &right),
        "{left} and {right} on {:?}",
        sim.pod_bridge().map(|b| b.subnet())
    );
    assert_eq!(
        http_get(&format!("http://{left}:{port}/")).await,
        "served-by-left\n"
    );
    assert_eq!(
        http_get(&format!("http://{right}:{port}/")).await,
        "served-by-right\n"
    );
}

#[tokio::test]
async fn an_isolated_pod_reaches_the_node_address_but_not_host_loopback() {
    let Some(sim) = isolated_docker_sim().await else {
        return;
    };
    let node = sim.node_ip();
    assert_ne!(node, std::net::Ipv4Addr::LOCALHOST);
    // A service on the node address (a runner, say), and a loopback-only
    // one of the host.
    let on_node = tokio::net::TcpListener::bind((node, 0)).await.unwrap();
    let loopback = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node_port = on_node.local_addr().unwrap().port();
    let loopback_port = loopback.local_addr().unwrap().port();
    let served = tokio::spawn(async move {
        let (mut conn, peer) = on_node.accept().await.unwrap();
        let mut request = [0u8; 1024];
        let _ = conn.read(&mut request).await.unwrap();
        conn.write_all(b"HTTP/1.0 200 OK\r\ncontent-length: 10\r\n\r\nnode-says\n")
            .await
            .unwrap();
        conn.shutdown().await.unwrap();
        peer.ip()
    });
    let script = format!(
        "echo env $NODE_IP $POD_IP; \
         wget -q -O - http://{node}:{node_port}/; \
         if wget -q -T 5 -O - http://127.0.0.1:{loopback_port}/ 2>/dev/null; \
         then echo loopback open; else echo loopback closed; fi"
    );
    let (pods, _) = create(
        &sim,
        json!({
            "metadata": {"name": "probe"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "probe", "image": BUSYBOX, "command": ["sh", "-c", script],
                    "env": [
                        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ]}]
            }
        }),
    )
    .await;
    let done = finished(&sim, "probe").await;
    let status = done.status.clone().unwrap();
    let probe_ip = status.pod_ip.clone().unwrap();
    assert_eq!(status.host_ip.as_deref(), Some(node.to_string().as_str()));
    let out = log(&pods, "probe", "probe").await;
    assert_eq!(
        out,
        format!("env {node} {probe_ip}\nnode-says\nloopback closed\n"),
        "{done:?}"
    );
    // The node saw the pod's own address.
    let peer = tokio::time::timeout(WAIT, served).await.unwrap().unwrap();
    assert_eq!(peer.to_string(), probe_ip);
}

#[tokio::test]
async fn containers_of_an_isolated_pod_share_localhost_and_the_hostname() {
    let Some(sim) = isolated_docker_sim().await else {
        return;
    };
    let port = test_support::free_port();
    // The server listens on the pod's loopback only; the client, another
    // container of the pod, reaches it there once it listens.
    let server = format!(
        "mkdir -p /tmp/www && echo shared-localhost > /tmp/www/index.html && \
         httpd -p 127.0.0.1:{port} -h /tmp/www && exec sleep 3600"
    );
    let client = format!(
        "until wget -q -O - http://127.0.0.1:{port}/ 2>/dev/null; do usleep 50000; done; hostname; echo $HOSTNAME"
    );
    let (pods, _) = create(
        &sim,
        json!({
            "metadata": {"name": "duo"},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "server", "image": BUSYBOX, "command": ["sh", "-c", server]},
                    {"name": "client", "image": BUSYBOX, "command": ["sh", "-c", client]}
                ]
            }
        }),
    )
    .await;
    let client_done = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .any(|c| {
                c.name == "client"
                    && c.state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .is_some()
            })
    };
    let pod = sim
        .wait_for::<Pod>("default", "duo", client_done, WAIT)
        .await
        .unwrap();
    let client_status = pod
        .status
        .unwrap()
        .container_statuses
        .unwrap()
        .into_iter()
        .find(|c| c.name == "client")
        .unwrap();
    let exit = client_status.state.unwrap().terminated.unwrap().exit_code;
    let out = log(&pods, "duo", "client").await;
    assert_eq!(exit, 0, "{out}");
    assert_eq!(out, "shared-localhost\nduo\nduo\n");
    // Another pod's loopback is its own: the server is not on the host's.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the pod's loopback service is not the host's"
    );
}

#[tokio::test]
async fn isolated_pods_leave_no_infra_container_veth_or_namespace() {
    let Some(sim) = isolated_docker_sim().await else {
        return;
    };
    let label = sim.container_label().unwrap();
    let pid = std::process::id();
    // Other tests of this process run simulators too: only this one's
    // bridge and the veths and namespaces of its pods count.
    let bridge = sim.pod_bridge().unwrap().name().to_owned();
    let mine = |names: Vec<String>, before: &[String]| -> Vec<String> {
        names
            .into_iter()
            .filter(|n| !before.contains(n) || *n == bridge)
            .collect()
    };
    let before = support::leftovers(pid);
    for name in ["kept", "deleted"] {
        create(&sim, web_pod(name, "", test_support::free_port(), name)).await;
        support::until_logged_within(&sim, name, "ready", WAIT).await;
    }
    assert_eq!(containers_labelled(&[&label, INFRA_CONTAINER]).len(), 2);
    let made = mine(support::leftovers(pid), &before);
    assert_eq!(made.len(), 5, "the bridge, 2 veths, 2 namespaces: {made:?}");

    // A deleted pod's infra container, veth and namespace go with it.
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    pods.delete("deleted", &DeleteParams::default())
        .await
        .unwrap();
    sim.wait_for_deletion("pods", "default", "deleted", WAIT)
        .await
        .unwrap();
    assert_eq!(containers_labelled(&[&label, INFRA_CONTAINER]).len(), 1);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = mine(support::leftovers(pid), &before);
        if left.len() == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "left: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    sim.shutdown().await;
    assert!(
        containers_labelled(&[&label]).is_empty(),
        "shutdown leaves no container, infra containers included"
    );
    let after = support::leftovers(pid);
    let left: Vec<&String> = after
        .iter()
        .filter(|n| made.contains(n) || **n == bridge)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The docker client as a path: the binary's `PATH` may not have it.
fn client_path() -> std::path::PathBuf {
    let named = std::path::PathBuf::from(client());
    if named.components().count() > 1 {
        return named;
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(&named))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{} is not on PATH", named.display()))
}

/// Waits until `done` holds, checking every 20 ms for at most [`WAIT`]
/// (for the machine's state, which sends no events).
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_killed_simulators_infra_containers_and_network_are_removed() {
    let Some(probe) = isolated_docker_sim().await else {
        return;
    };
    probe.shutdown().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, lines) = support::start_binary_in(
        dir.path(),
        &["--runtime", "docker", "--pod-network", "isolated"],
        None,
    );
    let node = lines
        .last()
        .and_then(|l| l.strip_prefix("node address "))
        .unwrap_or_else(|| panic!("{lines:?}"))
        .to_owned();
    assert!(!node.starts_with("127."), "{lines:?}");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(dir.path().join("kubeconfig")).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let pod: Pod =
        serde_json::from_value(web_pod("orphan", "", test_support::free_port(), "orphan")).unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let running =
        kube::runtime::wait::await_condition(pods.clone(), "orphan", |p: Option<&Pod>| {
            p.is_some_and(|p| phase(p) == "Running")
        });
    tokio::time::timeout(WAIT, running).await.unwrap().unwrap();
    let pod_label = format!("io.kubernetes.pod.uid={uid}");
    let pid = child.id();
    assert_eq!(containers_labelled(&[&pod_label, INFRA_CONTAINER]).len(), 1);
    let made = support::leftovers(pid);
    assert_eq!(made.len(), 3, "a bridge, a veth, a namespace: {made:?}");
    // Killed outright: its guardians remove its containers and network.
    child.kill().unwrap();
    child.wait().unwrap();
    until("the killed simulator's containers are removed", || {
        containers_labelled(&[&pod_label]).is_empty()
    })
    .await;
    until("the killed simulator's network is removed", || {
        support::leftovers(pid).is_empty()
    })
    .await;
}

#[tokio::test]
async fn without_the_infra_image_auto_falls_back_to_the_host_network_and_isolated_refuses() {
    require_engine();
    if isolated_docker_sim().await.is_none() {
        return;
    }
    // A client that has every image but the infra container's.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("docker");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" image inspect \"*\" {BUSYBOX} \"*) \
             echo 'Error: No such image: {BUSYBOX}' >&2; exit 1;; esac\nexec '{}' \"$@\"\n",
            client_path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let engine = wrapper.to_str().unwrap();
    let (child, lines) =
        support::start_binary(&["--runtime", "docker", "--container-engine", engine], None);
    assert_eq!(
        lines.last().map(String::as_str),
        Some("node address 127.0.0.1"),
        "{lines:?}"
    );
    let stderr = support::stop(child);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("host network"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(
        said[0].contains(&format!(
            "the pods' infra image {BUSYBOX} is not a local image"
        )),
        "{stderr}"
    );

    let (child, lines) = support::start_binary(
        &[
            "--runtime",
            "docker",
            "--container-engine",
            engine,
            "--pod-network",
            "isolated",
        ],
        None,
    );
    assert!(lines.is_empty(), "{lines:?}");
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("isolated pod networks are not available here: the pods' infra image"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_host_network_runs_docker_pods_as_before() {
    require_engine();
    let sim = support::builder()
        .runtime(Runtime::Docker)
        .pod_network(PodNetwork::Host)
        .start()
        .await
        .unwrap();
    assert!(sim.pod_bridge().is_none());
    assert_eq!(sim.node_ip(), std::net::Ipv4Addr::LOCALHOST);
    let label = sim.container_label().unwrap();
    create(
        &sim,
        web_pod("plain", "", test_support::free_port(), "plain"),
    )
    .await;
    support::until_logged_within(&sim, "plain", "ready", WAIT).await;
    let ip = pod_ip(&sim, "plain").await;
    assert!(ip.starts_with("127."), "{ip}");
    // No infra container: the pod's one container, on the host network.
    let ids = containers_labelled(&[&label]);
    assert_eq!(ids.len(), 1);
    let mode = docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.NetworkMode}}",
        &ids[0],
    ])
    .unwrap();
    assert_eq!(mode.trim(), "host");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_starting_simulator_removes_the_containers_of_dead_ones() {
    require_engine();
    // A container as a simulator that has ended (its guardian killed with
    // it) left it: labelled with a pid of this pid namespace nobody has.
    // The pid's process ends only once the container runs: a simulator
    // another test starts meanwhile sweeps a dead owner's containers, and
    // could remove this one between its create and its start. (`cat` on a
    // pipe ends with this test, should the test fail first.)
    let mut ended = Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let ns = ns.to_str().unwrap();
    let ns = &ns["pid:[".len()..ns.len() - 1];
    let owner = format!("kube-sim.owner={ns}.{}.1", ended.id());
    let since = docker(&["info", "--format", "{{.SystemTime}}"]).unwrap();
    let left = docker(&[
        "run",
        "--detach",
        "--network",
        "none",
        "--label",
        &owner,
        BUSYBOX,
        "sleep",
        "3600",
    ])
    .unwrap();
    ended.kill().unwrap();
    ended.wait().unwrap();
    let left = left.trim();
    let mut events = tokio::process::Command::new(client())
        .args(["events", "--format", "{{.Action}}"])
        .args(["--filter", &format!("container={left}")])
        .args(["--filter", "event=destroy", "--since", since.trim()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let sim = docker_sim().await;
    let mut destroyed = tokio::io::BufReader::new(events.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, destroyed.next_line())
        .await
        .expect("the dead simulator's container is removed")
        .unwrap();
    assert_eq!(line.as_deref(), Some("destroy"));
    sim.shutdown().await;
}
