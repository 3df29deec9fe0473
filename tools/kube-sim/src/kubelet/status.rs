//! The pod status the kubelet reports, built from an in-memory model:
//! phase, conditions, IPs, and each container's state / lastState /
//! restartCount, field for field as a real kubelet writes them.

use serde_json::{Map, Value, json};

use crate::meta;

#[derive(Debug, Clone, PartialEq)]
pub enum ContainerState {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: String,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: Option<String>,
        started_at: String,
        finished_at: String,
        container_id: String,
    },
}

impl ContainerState {
    pub fn waiting(reason: &str) -> Self {
        Self::Waiting {
            reason: reason.to_string(),
            message: None,
        }
    }

    fn to_json(&self) -> Value {
        match self {
            Self::Waiting { reason, message } => {
                let mut w = Map::new();
                w.insert("reason".into(), json!(reason));
                if let Some(m) = message {
                    w.insert("message".into(), json!(m));
                }
                json!({"waiting": w})
            }
            Self::Running { started_at } => json!({"running": {"startedAt": started_at}}),
            Self::Terminated {
                exit_code,
                reason,
                message,
                started_at,
                finished_at,
                container_id,
            } => {
                let mut t = Map::new();
                t.insert("exitCode".into(), json!(exit_code));
                t.insert("reason".into(), json!(reason));
                if let Some(m) = message {
                    t.insert("message".into(), json!(m));
                }
                t.insert("startedAt".into(), json!(started_at));
                t.insert("finishedAt".into(), json!(finished_at));
                t.insert("containerID".into(), json!(container_id));
                json!({"terminated": t})
            }
        }
    }

    pub fn is_terminated(&self) -> bool {
        matches!(self, Self::Terminated { .. })
    }

    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Terminated { exit_code, .. } => Some(*exit_code),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ContainerModel {
    pub name: String,
    pub image: String,
    pub image_id: String,
    pub container_id: Option<String>,
    pub state: ContainerState,
    pub last_state: Option<ContainerState>,
    pub restart_count: u32,
    pub ready: bool,
}

impl ContainerModel {
    pub fn new(name: &str, image: &str, waiting_reason: &str) -> Self {
        Self {
            name: name.to_string(),
            image: image.to_string(),
            image_id: String::new(),
            container_id: None,
            state: ContainerState::waiting(waiting_reason),
            last_state: None,
            restart_count: 0,
            ready: false,
        }
    }

    fn to_json(&self) -> Value {
        let mut c = Map::new();
        c.insert("name".into(), json!(self.name));
        c.insert("state".into(), self.state.to_json());
        c.insert(
            "lastState".into(),
            self.last_state
                .as_ref()
                .map_or(json!({}), ContainerState::to_json),
        );
        c.insert("ready".into(), json!(self.ready));
        c.insert("restartCount".into(), json!(self.restart_count));
        c.insert("image".into(), json!(self.image));
        c.insert("imageID".into(), json!(self.image_id));
        if let Some(id) = &self.container_id {
            c.insert("containerID".into(), json!(id));
        }
        c.insert(
            "started".into(),
            json!(matches!(self.state, ContainerState::Running { .. })),
        );
        Value::Object(c)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct PodModel {
    pub phase: Phase,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub pod_ip: String,
    pub host_ip: String,
    pub start_time: String,
    pub sandbox_ready: bool,
    pub init: Vec<ContainerModel>,
    pub main: Vec<ContainerModel>,
    pub qos_class: String,
}

impl PodModel {
    pub fn initialized(&self) -> bool {
        self.init.iter().all(|c| c.state.exit_code() == Some(0))
    }

    pub fn all_ready(&self) -> bool {
        !self.main.is_empty() && self.main.iter().all(|c| c.ready)
    }
}

fn condition(
    previous: &[Value],
    ty: &str,
    status: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> Value {
    let status_str = if status { "True" } else { "False" };
    // Keep the transition time while the status is unchanged.
    let since = previous
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
        .filter(|c| c.get("status").and_then(Value::as_str) == Some(status_str))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(meta::now_timestamp()));
    let mut c = Map::new();
    c.insert("type".into(), json!(ty));
    c.insert("status".into(), json!(status_str));
    c.insert("lastProbeTime".into(), Value::Null);
    c.insert("lastTransitionTime".into(), since);
    if let Some(r) = reason {
        c.insert("reason".into(), json!(r));
    }
    if let Some(m) = message {
        c.insert("message".into(), json!(m));
    }
    Value::Object(c)
}

/// The pod `status` for `model`, keeping condition transition times from
/// `previous` (the stored status).
pub fn render(model: &PodModel, previous: &Value) -> Value {
    let prev_conditions: Vec<Value> = previous
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let conditions = conditions(model, &prev_conditions);
    let mut s = Map::new();
    s.insert("phase".into(), json!(model.phase.as_str()));
    s.insert("conditions".into(), Value::Array(conditions));
    if let Some(r) = &model.reason {
        s.insert("reason".into(), json!(r));
    }
    if let Some(m) = &model.message {
        s.insert("message".into(), json!(m));
    }
    s.insert("hostIP".into(), json!(model.host_ip));
    s.insert("hostIPs".into(), json!([{"ip": model.host_ip}]));
    if !model.pod_ip.is_empty() {
        s.insert("podIP".into(), json!(model.pod_ip));
        s.insert("podIPs".into(), json!([{"ip": model.pod_ip}]));
    }
    s.insert("startTime".into(), json!(model.start_time));
    if !model.init.is_empty() {
        s.insert(
            "initContainerStatuses".into(),
            Value::Array(model.init.iter().map(ContainerModel::to_json).collect()),
        );
    }
    s.insert(
        "containerStatuses".into(),
        Value::Array(model.main.iter().map(ContainerModel::to_json).collect()),
    );
    s.insert("qosClass".into(), json!(model.qos_class));
    Value::Object(s)
}

/// The pod's conditions for `model`: sandbox, init, readiness and
/// scheduling, each keeping its transition time from `prev_conditions`
/// while its status is unchanged.
fn conditions(model: &PodModel, prev_conditions: &[Value]) -> Vec<Value> {
    let scheduled = prev_conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"))
        .cloned()
        .unwrap_or_else(|| condition(&[], "PodScheduled", true, None, None));
    let terminal = matches!(model.phase, Phase::Succeeded | Phase::Failed);
    let incomplete: Vec<&str> = model
        .init
        .iter()
        .filter(|c| c.state.exit_code() != Some(0))
        .map(|c| c.name.as_str())
        .collect();
    let unready: Vec<&str> = model
        .main
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let initialized = incomplete.is_empty();
    let ready = unready.is_empty() && !terminal;
    let (ready_reason, ready_msg) = if ready {
        (None, None)
    } else if terminal {
        (Some("PodCompleted"), None)
    } else {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let init_cond = if initialized {
        condition(prev_conditions, "Initialized", true, None, None)
    } else {
        condition(
            prev_conditions,
            "Initialized",
            false,
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                incomplete.join(" ")
            )),
        )
    };
    vec![
        condition(
            prev_conditions,
            "PodReadyToStartContainers",
            model.sandbox_ready && !terminal,
            None,
            None,
        ),
        init_cond,
        condition(
            prev_conditions,
            "Ready",
            ready,
            ready_reason,
            ready_msg.clone(),
        ),
        condition(
            prev_conditions,
            "ContainersReady",
            ready,
            ready_reason,
            ready_msg,
        ),
        scheduled,
    ]
}

/// The phase a set of finished main containers gives a pod with
/// `restartPolicy: Never`/`OnFailure` (all zero ⇒ Succeeded).
pub fn terminal_phase(main: &[ContainerModel]) -> Phase {
    if main.iter().all(|c| c.state.exit_code() == Some(0)) {
        Phase::Succeeded
    } else {
        Phase::Failed
    }
}

/// The `reason` of a container's `terminated` state for an exit code.
pub fn terminated_reason(exit_code: i32) -> &'static str {
    if exit_code == 0 { "Completed" } else { "Error" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> PodModel {
        PodModel {
            phase: Phase::Pending,
            reason: None,
            message: None,
            pod_ip: "127.0.1.5".into(),
            host_ip: "127.0.0.1".into(),
            start_time: "2025-01-01T00:00:00Z".into(),
            sandbox_ready: true,
            init: vec![ContainerModel::new(
                "body-fetch",
                "docker.io/library/busybox:stable",
                "PodInitializing",
            )],
            main: vec![ContainerModel::new(
                "session",
                "docker.io/telorun/node:24",
                "PodInitializing",
            )],
            qos_class: "Guaranteed".into(),
        }
    }

    #[test]
    fn a_pending_pod_reports_incomplete_init_and_unready_containers() {
        let s = render(&model(), &json!({}));
        assert_eq!(s["phase"], "Pending");
        assert_eq!(s["podIP"], "127.0.1.5");
        assert_eq!(s["conditions"][1]["type"], "Initialized");
        assert_eq!(
            s["conditions"][1]["message"],
            "containers with incomplete status: [body-fetch]"
        );
        assert_eq!(s["conditions"][2]["reason"], "ContainersNotReady");
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "PodInitializing"
        );
        assert_eq!(s["containerStatuses"][0]["lastState"], json!({}));
        assert_eq!(s["containerStatuses"][0]["restartCount"], 0);
    }

    #[test]
    fn a_completed_pod_is_not_ready_because_it_completed() {
        let mut m = model();
        m.init[0].state = ContainerState::Terminated {
            exit_code: 0,
            reason: "Completed".into(),
            message: None,
            started_at: "t".into(),
            finished_at: "t".into(),
            container_id: "containerd://x".into(),
        };
        m.main[0].state = m.init[0].state.clone();
        m.phase = terminal_phase(&m.main);
        let s = render(&m, &json!({}));
        assert_eq!(s["phase"], "Succeeded");
        assert_eq!(s["conditions"][2]["reason"], "PodCompleted");
        assert_eq!(s["conditions"][1]["status"], "True");
    }
}
