//! What a session pod's status means for the session: the progress line while
//! it comes up, whether it can still start, and how it ended
//! (docs/contract.md §9.5). Pure functions over the `Pod` object.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod, PodStatus};
use runner_core::types::RunStatus;

use crate::images::telo::{IMAGE_WAIT_REASONS, TeloPins, unavailable_release_message};
use crate::pod::env_secret::env_secret_in_kubelet_message;
use crate::pod::event_informer::ContainerKind;
use crate::pod::progress::{Line, Stage};

/// Longest excerpt of a kubelet or pod message quoted in a failure; image pull
/// errors can run to kilobytes of registry response.
pub const MAX_FAILURE_DETAIL_CHARS: usize = 500;

/// Waiting reasons a pod does not recover from by itself within a session's
/// start window. Each names something only a person can change: the image
/// reference, the registry credentials, a Secret or ConfigMap the container
/// refers to, the container's command.
///
/// `ErrImagePull` and `ImagePullBackOff` count although a real kubelet keeps
/// retrying the pull: a tag that does not exist, or a registry that refuses
/// the credentials, does not start existing or accepting while the session
/// waits, and a registry outage outlasts the start deadline anyway. Reporting
/// the kubelet's own reason within seconds beats a bare "did not reach
/// Running" after two minutes; the user can simply run again.
pub const START_BLOCKING_WAIT_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Waiting reasons every healthy pod passes through; never a failure.
const BENIGN_WAIT_REASONS: &[&str] = &["PodInitializing", "ContainerCreating"];

/// The progress line for a pod still coming up (`Pending`), `None` once it is
/// past that. The first waiting container, init containers first, says what
/// the pod is busy with; no waiting container means it is not yet scheduled.
pub fn provision_message(pod: &Pod) -> Option<String> {
    provision_line(pod).map(|line| line.message)
}

/// [`provision_message`] with its place in the pod's start: a pull belongs
/// to the container waiting on it; `PodInitializing` is the init container
/// being set up, `ContainerCreating` the container that waits so. Reasons
/// the runner does not know have no place (they are news).
pub fn provision_line(pod: &Pod) -> Option<Line> {
    let status = pod.status.as_ref()?;
    if PodPhase::of(pod) != Some(PodPhase::Pending) {
        return None;
    }
    let waiting = container_statuses(status).find_map(|(label, container)| {
        let kind = if label == "init container" {
            ContainerKind::Init
        } else {
            ContainerKind::Main
        };
        container
            .state
            .as_ref()
            .and_then(|state| state.waiting.as_ref())
            .and_then(|waiting| non_blank(waiting.reason.as_deref()))
            .map(|reason| (reason, kind))
    });
    let (message, stage) = match waiting {
        Some(("ContainerCreating", kind)) => ("Creating container", Some(Stage::setup(kind))),
        Some(("PodInitializing", _)) => ("Delivering application", Some(Stage::InitSetup)),
        Some(("ErrImagePull" | "ImagePullBackOff", kind)) => {
            ("Pulling image", Some(Stage::pulling(kind)))
        }
        Some((other, _)) => (other, None),
        None => ("Scheduling", Some(Stage::Scheduling)),
    };
    Some(Line {
        stage,
        message: message.to_owned(),
    })
}

/// The session status a finished pod stands for. A stop the user asked for
/// is `stopped` whatever the pod says, since deleting it is what failed it.
pub fn terminal_status(pod: &Pod, user_stopped: bool) -> RunStatus {
    terminal_status_within(pod, user_stopped, None)
}

/// [`terminal_status`] of a session whose containers' memory limit is
/// `memory_limit` (the runner's pod informer keeps pods without their spec, so it
/// is told rather than read).
pub fn terminal_status_within(
    pod: &Pod,
    user_stopped: bool,
    memory_limit: Option<&str>,
) -> RunStatus {
    if user_stopped {
        return RunStatus::Stopped;
    }
    if PodPhase::of(pod) == Some(PodPhase::Succeeded) {
        let code = container_exit_code(pod).unwrap_or(0);
        return RunStatus::Exited {
            code: i64::from(code),
        };
    }
    // The workload ending with a non-zero code is the workload's answer, not
    // a platform failure: report it as `exited` with its code, as the local
    // and docker backends do. (The reference reported every non-zero exit as
    // `failed`, so a script's `exit 3` read like a broken cluster.) Anything
    // the platform did — OOM kill, deadline, eviction, a failed init
    // container — stays `failed` with its reason.
    if let Some(code) = plain_exit_code(pod) {
        return RunStatus::Exited {
            code: i64::from(code),
        };
    }
    RunStatus::Failed {
        message: failure_message_within(Some(pod), memory_limit),
    }
}

/// The main container's exit code when the process simply exited: it
/// terminated with the kubelet's generic reason (`Error`, or `Completed`), the
/// pod itself carries no reason of its own (deadline, eviction), and every init
/// container completed.
fn plain_exit_code(pod: &Pod) -> Option<i32> {
    let status = pod.status.as_ref()?;
    if non_blank(status.reason.as_deref()).is_some() {
        return None;
    }
    let inits_ok = status.init_container_statuses.iter().flatten().all(|init| {
        init.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    });
    if !inits_ok {
        return None;
    }
    let terminated = status
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()?;
    match terminated.reason.as_deref() {
        None | Some("Error") | Some("Completed") => Some(terminated.exit_code),
        Some(_) => None,
    }
}

/// Exit code of the pod's first (main) container, once it terminated.
pub fn container_exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|terminated| terminated.exit_code)
}

/// Why a pod failed, as specifically as its status allows. Init containers
/// are read first: a failed init container leaves the main one never
/// started, and reading only the main container would fall through to the
/// bare "pod failed". Then the pod's own message (e.g. the deadline), its
/// reason (e.g. `Evicted`), and finally "pod failed".
pub fn pod_failure_message(pod: Option<&Pod>) -> String {
    failure_message_within(pod, None)
}

/// [`pod_failure_message`] with the containers' memory limit told (else
/// read from the pod's spec, when it has one).
pub fn failure_message_within(pod: Option<&Pod>, memory_limit: Option<&str>) -> String {
    let Some(status) = pod.and_then(|pod| pod.status.as_ref()) else {
        return "pod failed".to_owned();
    };
    let container_problem = container_statuses(status).find_map(|(label, container)| {
        let state = container
            .state
            .as_ref()
            .filter(|state| state_problem(Some(state)).is_some())
            .or(container.last_state.as_ref());
        let problem = state_problem(state)?;
        let limit = pod
            .and_then(|pod| memory_limit_of(pod, &container.name))
            .or_else(|| memory_limit.map(str::to_owned));
        Some(format!(
            "{label} \"{}\" {problem}{}",
            container.name,
            oom_explanation(state, limit.as_deref())
        ))
    });
    container_problem
        .or_else(|| non_blank(status.message.as_deref()).map(truncate_detail))
        .or_else(|| non_blank(status.reason.as_deref()).map(str::to_owned))
        .unwrap_or_else(|| "pod failed".to_owned())
}

/// The failure message of a pod that cannot reach `Running` on its own, or
/// `None` while it still might. This is what lets a start fail within seconds
/// with the kubelet's or scheduler's reason instead of waiting out the start
/// deadline: a container waiting for one of [`START_BLOCKING_WAIT_REASONS`],
/// or a pod the scheduler reported `Unschedulable`.
///
/// An unschedulable pod can still be placed if nodes are added, as a cluster
/// autoscaler does; a session start does not outlive a node scale-up, so it
/// is reported rather than waited on.
pub fn start_blocker(pod: &Pod) -> Option<String> {
    start_blocker_naming(pod, &TeloPins::default())
}

/// [`start_blocker`] of a pod some of whose containers run an image chosen
/// for a telo release: when such an image cannot be pulled, the failure
/// names the release first, since that is what the user picked and what
/// they must change (the tag is the runner's choice, not theirs).
pub fn start_blocker_naming(pod: &Pod, pins: &TeloPins) -> Option<String> {
    let status = pod.status.as_ref()?;
    if is_finished(pod) {
        return None;
    }
    let blocked_container = container_statuses(status).find_map(|(label, container)| {
        let waiting = container.state.as_ref()?.waiting.as_ref()?;
        let reason = non_blank(waiting.reason.as_deref())?;
        START_BLOCKING_WAIT_REASONS.contains(&reason).then(|| {
            let problem = waiting_problem(reason, waiting.message.as_deref());
            let env_secret = (reason == "CreateContainerConfigError")
                .then(|| non_blank(waiting.message.as_deref()))
                .flatten()
                .and_then(|message| env_secret_in_kubelet_message(message.trim()));
            match (pins.of_container(&container.name), env_secret) {
                (Some(pin), _) if IMAGE_WAIT_REASONS.contains(&reason) => {
                    unavailable_release_message(pin, &problem)
                }
                // The kubelet's words name a Secret; the runner's say it is
                // the session's own environment, and who took it away.
                (_, Some(secret)) => format!(
                    "{label} \"{}\" could not be given its environment: its Secret \"{secret}\" was deleted or changed outside the runner ({reason}{})",
                    container.name,
                    detail_suffix(waiting.message.as_deref()),
                ),
                _ => format!("{label} \"{}\" {problem}", container.name),
            }
        })
    });
    blocked_container.or_else(|| unschedulable(status))
}

fn unschedulable(status: &PodStatus) -> Option<String> {
    let condition = status.conditions.as_ref()?.iter().find(|condition| {
        condition.type_ == "PodScheduled"
            && condition.status == "False"
            && condition.reason.as_deref() == Some("Unschedulable")
    })?;
    Some(match non_blank(condition.message.as_deref()) {
        Some(message) => format!("pod cannot be scheduled: {}", truncate_detail(message)),
        None => "pod cannot be scheduled".to_owned(),
    })
}

/// Init containers, then regular ones, each with the label failure messages
/// use for it.
fn container_statuses(
    status: &PodStatus,
) -> impl Iterator<Item = (&'static str, &ContainerStatus)> {
    let init = status.init_container_statuses.iter().flatten();
    let main = status.container_statuses.iter().flatten();
    init.map(|container| ("init container", container))
        .chain(main.map(|container| ("container", container)))
}

/// A non-zero exit, or a waiting reason other than the benign start-up ones.
/// What an OOM kill means, said plainly: the reason alone reads like a crash
/// of the platform, while the fix is the workload's memory or the limit.
fn oom_explanation(state: Option<&ContainerState>, limit: Option<&str>) -> String {
    let killed = state
        .and_then(|state| state.terminated.as_ref())
        .is_some_and(|t| {
            t.reason.as_deref() == Some("OOMKilled") && non_blank(t.message.as_deref()).is_none()
        });
    match (killed, limit) {
        (true, Some(limit)) => {
            format!(": it used more memory than its limit of {limit} and was killed")
        }
        _ => String::new(),
    }
}

/// The memory limit the pod spec gives container `name`, as written.
fn memory_limit_of(pod: &Pod, name: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|container| container.name == name)?
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("memory")
        .map(|quantity| quantity.0.clone())
}

fn state_problem(state: Option<&ContainerState>) -> Option<String> {
    let state = state?;
    if let Some(terminated) = state.terminated.as_ref().filter(|t| t.exit_code != 0) {
        let reason = non_blank(terminated.reason.as_deref())
            .map(|reason| format!("{reason} "))
            .unwrap_or_default();
        let detail = detail_suffix(terminated.message.as_deref());
        return Some(format!(
            "failed: {reason}(exit code {}){detail}",
            terminated.exit_code
        ));
    }
    let waiting = state.waiting.as_ref()?;
    let reason = non_blank(waiting.reason.as_deref())?;
    if BENIGN_WAIT_REASONS.contains(&reason) {
        return None;
    }
    Some(waiting_problem(reason, waiting.message.as_deref()))
}

fn waiting_problem(reason: &str, message: Option<&str>) -> String {
    format!("waiting: {reason}{}", detail_suffix(message))
}

fn detail_suffix(message: Option<&str>) -> String {
    non_blank(message)
        .map(|message| format!(": {}", truncate_detail(message)))
        .unwrap_or_default()
}

fn truncate_detail(text: &str) -> String {
    let trimmed = text.trim();
    match trimmed.char_indices().nth(MAX_FAILURE_DETAIL_CHARS) {
        Some((cut, _)) => format!("{}…", &trimmed[..cut]),
        None => trimmed.to_owned(),
    }
}

/// A pod's `status.phase`, typed. A phase this runner does not know (a
/// newer apiserver's) is `None`, as an absent one is: neither says the pod
/// ran or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    pub fn of(pod: &Pod) -> Option<Self> {
        match pod.status.as_ref()?.phase.as_deref()? {
            "Pending" => Some(Self::Pending),
            "Running" => Some(Self::Running),
            "Succeeded" => Some(Self::Succeeded),
            "Failed" => Some(Self::Failed),
            "Unknown" => Some(Self::Unknown),
            _ => None,
        }
    }

    /// As the pod status spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Unknown => "Unknown",
        }
    }

    /// Every container ended and none will restart.
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// Whether `pod` is in a finished phase.
pub fn is_finished(pod: &Pod) -> bool {
    PodPhase::of(pod).is_some_and(PodPhase::is_finished)
}

/// Blank messages and reasons are treated as absent, so a failure never ends
/// in `": "` and is never just a space (a hand-edited or odd kubelet status
/// can carry `reason: " "`).
/// A reason or message that says something: one with a letter or a digit
/// (a hostile or broken status may carry only spaces or punctuation, such
/// as `": "`, which would read as a dangling detail).
fn non_blank(text: Option<&str>) -> Option<&str> {
    text.filter(|text| text.chars().any(char::is_alphanumeric))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::{Value, json};

    fn pod(status: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "telo-run-abc" },
            "status": status,
        }))
        .unwrap()
    }

    #[rstest]
    #[case::pending("Pending", Some(PodPhase::Pending), false)]
    #[case::running("Running", Some(PodPhase::Running), false)]
    #[case::succeeded("Succeeded", Some(PodPhase::Succeeded), true)]
    #[case::failed("Failed", Some(PodPhase::Failed), true)]
    #[case::unknown("Unknown", Some(PodPhase::Unknown), false)]
    #[case::newer("Hibernating", None, false)]
    fn phases_are_read_as_the_apiserver_spells_them(
        #[case] phase: &str,
        #[case] expected: Option<PodPhase>,
        #[case] finished: bool,
    ) {
        let pod = pod(json!({ "phase": phase }));
        assert_eq!(PodPhase::of(&pod), expected);
        assert_eq!(is_finished(&pod), finished);
    }

    fn init_terminated(exit_code: i32, reason: &str, message: Option<&str>) -> Value {
        let mut terminated = json!({ "exitCode": exit_code, "reason": reason });
        if let Some(message) = message {
            terminated["message"] = json!(message);
        }
        json!({
            "phase": "Failed",
            "initContainerStatuses": [status_of("bundle-fetch", json!({ "terminated": terminated }))],
        })
    }

    fn status_of(name: &str, state: Value) -> Value {
        json!({
            "name": name, "image": "img", "imageID": "", "ready": false,
            "restartCount": 0, "state": state,
        })
    }

    fn waiting(name: &str, reason: &str, message: Option<&str>) -> Value {
        let mut waiting = json!({ "reason": reason });
        if let Some(message) = message {
            waiting["message"] = json!(message);
        }
        status_of(name, json!({ "waiting": waiting }))
    }

    // --- pod_failure_message: the reference's backend-failure cases ---

    #[test]
    fn a_failed_init_container_is_named_with_its_exit_code() {
        let pod = pod(init_terminated(1, "Error", None));
        assert_eq!(
            pod_failure_message(Some(&pod)),
            "init container \"bundle-fetch\" failed: Error (exit code 1)"
        );
    }

    #[test]
    fn a_failed_init_container_carries_its_termination_message() {
        let pod = pod(init_terminated(
            1,
            "Error",
            Some("wget: download timed out\n"),
        ));
        assert_eq!(
            pod_failure_message(Some(&pod)),
            "init container \"bundle-fetch\" failed: Error (exit code 1): wget: download timed out"
        );
    }

    #[test]
    fn an_init_container_stuck_pulling_is_named_with_the_kubelet_reason() {
        let pod = pod(json!({
            "phase": "Pending",
            "initContainerStatuses": [waiting("bundle-fetch", "ImagePullBackOff", Some("Back-off pulling image"))],
        }));
        assert_eq!(
            pod_failure_message(Some(&pod)),
            "init container \"bundle-fetch\" waiting: ImagePullBackOff: Back-off pulling image"
        );
    }

    #[test]
    fn a_completed_init_container_is_skipped_for_the_failing_main_one() {
        let pod = pod(json!({
            "phase": "Failed",
            "initContainerStatuses": [status_of("bundle-fetch", json!({ "terminated": { "exitCode": 0, "reason": "Completed" } }))],
            "containerStatuses": [status_of("session", json!({ "terminated": { "exitCode": 137, "reason": "OOMKilled" } }))],
        }));
        assert_eq!(
            pod_failure_message(Some(&pod)),
            "container \"session\" failed: OOMKilled (exit code 137)"
        );
    }

    #[test]
    fn an_oom_kill_names_the_memory_limit_it_went_over() {
        let mut pod = pod(json!({
            "phase": "Failed",
            "containerStatuses": [status_of("session", json!({ "terminated": { "exitCode": 137, "reason": "OOMKilled" } }))],
        }));
        pod.spec = Some(
            serde_json::from_value(json!({
                "containers": [{"name": "session", "resources": {"limits": {"memory": "256Mi"}}}],
            }))
            .unwrap(),
        );
        assert_eq!(
            pod_failure_message(Some(&pod)),
            "container \"session\" failed: OOMKilled (exit code 137): it used more memory than its limit of 256Mi and was killed"
        );
    }

    #[test]
    fn a_benign_wait_falls_through_to_the_pod_message() {
        let pod = pod(json!({
            "phase": "Failed",
            "message": "Pod was active on the node longer than the specified deadline",
            "reason": "DeadlineExceeded",
            "containerStatuses": [waiting("session", "PodInitializing", None)],
        }));
        assert_eq!(
            pod_failure_message(Some(&pod)),
            "Pod was active on the node longer than the specified deadline"
        );
    }

    #[test]
    fn a_pod_reason_alone_is_reported() {
        let pod = pod(json!({ "phase": "Failed", "reason": "Evicted" }));
        assert_eq!(pod_failure_message(Some(&pod)), "Evicted");
    }

    #[test]
    fn a_pod_with_nothing_to_say_simply_failed() {
        assert_eq!(
            pod_failure_message(Some(&pod(json!({ "phase": "Failed" })))),
            "pod failed"
        );
        assert_eq!(pod_failure_message(None), "pod failed");
        let bare: Pod = serde_json::from_value(json!({ "metadata": {} })).unwrap();
        assert_eq!(pod_failure_message(Some(&bare)), "pod failed");
    }

    #[test]
    fn long_termination_messages_are_truncated() {
        let long = "x".repeat(800);
        let pod = pod(json!({
            "phase": "Failed",
            "containerStatuses": [status_of("session", json!({ "terminated": { "exitCode": 1, "reason": "Error", "message": long } }))],
        }));
        let message = pod_failure_message(Some(&pod));
        assert!(message.ends_with('…'), "{message}");
        assert!(message.chars().count() < 560, "{}", message.chars().count());
        assert!(message.contains(&"x".repeat(500)));
        assert!(!message.contains(&"x".repeat(501)));
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        let long = "é".repeat(600);
        let pod = pod(json!({ "phase": "Failed", "message": long }));
        let message = pod_failure_message(Some(&pod));
        assert_eq!(message.chars().count(), 501);
        assert!(message.ends_with("é…"));
    }

    #[test]
    fn the_previous_state_explains_a_container_waiting_after_a_crash() {
        let mut container = waiting("session", "PodInitializing", None);
        container["lastState"] = json!({ "terminated": { "exitCode": 2, "message": "boom" } });
        let pod = pod(json!({ "phase": "Failed", "containerStatuses": [container] }));
        assert_eq!(
            pod_failure_message(Some(&pod)),
            "container \"session\" failed: (exit code 2): boom"
        );
    }

    #[test]
    fn blank_messages_are_treated_as_absent() {
        let pod = pod(json!({
            "phase": "Failed",
            "message": "   ",
            "reason": "Evicted",
            "containerStatuses": [status_of("session", json!({ "terminated": { "exitCode": 1, "reason": "Error", "message": " \n" } }))],
        }));
        assert_eq!(
            pod_failure_message(Some(&pod)),
            "container \"session\" failed: Error (exit code 1)"
        );
    }

    // --- provision_message ---

    #[rstest]
    #[case::nothing_waiting(json!({ "phase": "Pending" }), Some("Scheduling"))]
    #[case::creating(
        json!({ "phase": "Pending", "containerStatuses": [waiting("session", "ContainerCreating", None)] }),
        Some("Creating container")
    )]
    #[case::delivering(
        json!({ "phase": "Pending", "containerStatuses": [waiting("session", "PodInitializing", None)] }),
        Some("Delivering application")
    )]
    #[case::pulling(
        json!({ "phase": "Pending", "containerStatuses": [waiting("session", "ErrImagePull", None)] }),
        Some("Pulling image")
    )]
    #[case::pull_backoff(
        json!({ "phase": "Pending", "initContainerStatuses": [waiting("body-fetch", "ImagePullBackOff", None)] }),
        Some("Pulling image")
    )]
    #[case::other_reasons_verbatim(
        json!({ "phase": "Pending", "containerStatuses": [waiting("session", "CreateContainerConfigError", Some("secret missing"))] }),
        Some("CreateContainerConfigError")
    )]
    #[case::init_containers_first(
        json!({
            "phase": "Pending",
            "initContainerStatuses": [waiting("body-fetch", "ContainerCreating", None)],
            "containerStatuses": [waiting("session", "PodInitializing", None)],
        }),
        Some("Creating container")
    )]
    #[case::empty_reason_is_no_reason(
        json!({ "phase": "Pending", "containerStatuses": [waiting("session", "", None)] }),
        Some("Scheduling")
    )]
    #[case::running(json!({ "phase": "Running" }), None)]
    #[case::succeeded(json!({ "phase": "Succeeded" }), None)]
    #[case::no_phase(json!({}), None)]
    fn provision_messages_follow_the_pending_pod(
        #[case] status: Value,
        #[case] expected: Option<&str>,
    ) {
        assert_eq!(provision_message(&pod(status)).as_deref(), expected);
    }

    #[rstest]
    #[case::scheduling(json!({ "phase": "Pending" }), Some(Stage::Scheduling))]
    #[case::init_set_up(
        json!({ "phase": "Pending", "containerStatuses": [waiting("session", "PodInitializing", None)] }),
        Some(Stage::InitSetup)
    )]
    #[case::created(
        json!({ "phase": "Pending", "containerStatuses": [waiting("session", "ContainerCreating", None)] }),
        Some(Stage::MainSetup)
    )]
    #[case::init_pull(
        json!({ "phase": "Pending", "initContainerStatuses": [waiting("body-fetch", "ImagePullBackOff", None)] }),
        Some(Stage::InitPulling)
    )]
    #[case::unknown_reason_is_news(
        json!({ "phase": "Pending", "containerStatuses": [waiting("session", "CreateContainerConfigError", None)] }),
        None
    )]
    fn provision_lines_have_their_place_in_the_start(
        #[case] status: Value,
        #[case] stage: Option<Stage>,
    ) {
        assert_eq!(provision_line(&pod(status)).unwrap().stage, stage);
    }

    // --- terminal_status and container_exit_code ---

    fn succeeded(exit_code: Option<i32>) -> Pod {
        let state = match exit_code {
            Some(code) => json!({ "terminated": { "exitCode": code } }),
            None => json!({}),
        };
        pod(json!({ "phase": "Succeeded", "containerStatuses": [status_of("session", state)] }))
    }

    #[test]
    fn a_user_stop_is_stopped_whatever_the_pod_says() {
        assert_eq!(
            terminal_status(&succeeded(Some(0)), true),
            RunStatus::Stopped
        );
        let failed = pod(json!({ "phase": "Failed", "reason": "Evicted" }));
        assert_eq!(terminal_status(&failed, true), RunStatus::Stopped);
    }

    #[rstest]
    #[case(Some(0), 0)]
    #[case(Some(3), 3)]
    #[case(None, 0)]
    fn a_succeeded_pod_exits_with_its_container_code(
        #[case] exit_code: Option<i32>,
        #[case] expected: i64,
    ) {
        assert_eq!(
            terminal_status(&succeeded(exit_code), false),
            RunStatus::Exited { code: expected }
        );
    }

    #[test]
    fn any_other_end_is_a_failure_with_the_derived_message() {
        let pod = pod(init_terminated(1, "Error", None));
        assert_eq!(
            terminal_status(&pod, false),
            RunStatus::Failed {
                message: "init container \"bundle-fetch\" failed: Error (exit code 1)".into()
            }
        );
    }

    #[test]
    fn the_exit_code_is_read_from_the_first_container_only() {
        assert_eq!(container_exit_code(&succeeded(Some(7))), Some(7));
        assert_eq!(container_exit_code(&succeeded(None)), None);
        assert_eq!(
            container_exit_code(&pod(json!({ "phase": "Running" }))),
            None
        );
        let second_only = pod(json!({
            "phase": "Running",
            "containerStatuses": [
                status_of("workspace", json!({ "running": {} })),
                status_of("app-web", json!({ "terminated": { "exitCode": 4 } })),
            ],
        }));
        assert_eq!(container_exit_code(&second_only), None);
    }

    // --- start_blocker ---

    #[rstest]
    #[case("ErrImagePull")]
    #[case("ImagePullBackOff")]
    #[case("InvalidImageName")]
    #[case("ErrImageNeverPull")]
    #[case("CreateContainerConfigError")]
    #[case("CreateContainerError")]
    #[case("RunContainerError")]
    fn a_container_that_cannot_start_blocks_the_start(#[case] reason: &str) {
        let pod = pod(json!({
            "phase": "Pending",
            "containerStatuses": [waiting("session", reason, Some("the kubelet says why"))],
        }));
        assert_eq!(
            start_blocker(&pod),
            Some(format!(
                "container \"session\" waiting: {reason}: the kubelet says why"
            ))
        );
    }

    fn pins() -> TeloPins {
        let mut pins = TeloPins::default();
        pins.push(
            crate::images::telo::TeloImageSource::default()
                .pin("app-web", "0.99.0")
                .expect("a release"),
        );
        pins
    }

    #[rstest]
    #[case("ErrImagePull")]
    #[case("ImagePullBackOff")]
    #[case("ErrImageNeverPull")]
    fn a_release_image_that_cannot_be_pulled_names_the_release(#[case] reason: &str) {
        let pod = pod(json!({
            "phase": "Pending",
            "containerStatuses": [
                waiting("workspace", "ContainerCreating", None),
                waiting("app-web", reason, Some("not found")),
            ],
        }));
        assert_eq!(
            start_blocker_naming(&pod, &pins()),
            Some(format!(
                "telo 0.99.0 is not available to this runner: image \"telorun/node:0.99.0-slim\" \
                 of container \"app-web\" could not be pulled (waiting: {reason}: not found)"
            ))
        );
    }

    #[test]
    fn an_unpinned_container_or_a_config_error_keeps_the_kubelet_account() {
        let unpinned = pod(json!({
            "phase": "Pending",
            "containerStatuses": [waiting("workspace", "ErrImagePull", Some("not found"))],
        }));
        assert_eq!(
            start_blocker_naming(&unpinned, &pins()).as_deref(),
            Some("container \"workspace\" waiting: ErrImagePull: not found")
        );
        let config_error = pod(json!({
            "phase": "Pending",
            "containerStatuses": [waiting("app-web", "CreateContainerConfigError", Some("no secret"))],
        }));
        assert_eq!(
            start_blocker_naming(&config_error, &pins()).as_deref(),
            Some("container \"app-web\" waiting: CreateContainerConfigError: no secret")
        );
    }

    #[rstest]
    #[case::deleted("secret \"telo-run-abc234defghi-env-0badc0de\" not found")]
    #[case::key_removed(
        "couldn't find key session.0 in Secret telo-sessions/telo-run-abc234defghi-env-0badc0de"
    )]
    fn a_missing_env_secret_is_told_as_the_sessions_environment(#[case] kubelet: &str) {
        let pod = pod(json!({
            "phase": "Pending",
            "containerStatuses": [waiting("session", "CreateContainerConfigError", Some(kubelet))],
        }));
        assert_eq!(
            start_blocker(&pod),
            Some(format!(
                "container \"session\" could not be given its environment: its Secret \
                 \"telo-run-abc234defghi-env-0badc0de\" was deleted or changed outside the runner \
                 (CreateContainerConfigError: {kubelet})"
            ))
        );
        // Another Secret (the operator's own) keeps the kubelet's account.
        let other = pod_with_waiting("secret \"regcred\" not found");
        assert_eq!(
            start_blocker(&other).as_deref(),
            Some(
                "container \"session\" waiting: CreateContainerConfigError: secret \"regcred\" not found"
            )
        );
    }

    fn pod_with_waiting(message: &str) -> Pod {
        pod(json!({
            "phase": "Pending",
            "containerStatuses": [waiting("session", "CreateContainerConfigError", Some(message))],
        }))
    }

    #[test]
    fn an_init_container_that_cannot_pull_blocks_the_start() {
        let pod = pod(json!({
            "phase": "Pending",
            "initContainerStatuses": [waiting("body-fetch", "ErrImagePull", Some("manifest unknown"))],
            "containerStatuses": [waiting("session", "PodInitializing", None)],
        }));
        assert_eq!(
            start_blocker(&pod).as_deref(),
            Some("init container \"body-fetch\" waiting: ErrImagePull: manifest unknown")
        );
    }

    #[test]
    fn a_blocking_reason_without_a_message_is_still_reported() {
        let pod = pod(json!({
            "phase": "Pending",
            "containerStatuses": [waiting("session", "InvalidImageName", None)],
        }));
        assert_eq!(
            start_blocker(&pod).as_deref(),
            Some("container \"session\" waiting: InvalidImageName")
        );
    }

    #[rstest]
    #[case::scheduling(json!({ "phase": "Pending" }))]
    #[case::creating(json!({ "phase": "Pending", "containerStatuses": [waiting("session", "ContainerCreating", None)] }))]
    #[case::delivering(json!({ "phase": "Pending", "containerStatuses": [waiting("session", "PodInitializing", None)] }))]
    #[case::unknown_reason(json!({ "phase": "Pending", "containerStatuses": [waiting("session", "SomethingNew", None)] }))]
    #[case::running(json!({ "phase": "Running", "containerStatuses": [status_of("session", json!({ "running": {} }))] }))]
    #[case::already_failed(json!({ "phase": "Failed", "containerStatuses": [waiting("session", "ErrImagePull", None)] }))]
    #[case::scheduling_gated(json!({
        "phase": "Pending",
        "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "SchedulingGated" }],
    }))]
    #[case::scheduled(json!({
        "phase": "Pending",
        "conditions": [{ "type": "PodScheduled", "status": "True" }],
    }))]
    fn a_pod_that_may_still_start_is_not_blocked(#[case] status: Value) {
        assert_eq!(start_blocker(&pod(status)), None);
    }

    #[test]
    fn an_unschedulable_pod_is_reported_with_the_scheduler_message() {
        let pod = pod(json!({
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory.",
            }],
        }));
        assert_eq!(
            start_blocker(&pod).as_deref(),
            Some("pod cannot be scheduled: 0/3 nodes are available: 3 Insufficient memory.")
        );
    }

    #[test]
    fn an_unschedulable_pod_without_a_message_is_still_reported() {
        let pod = pod(json!({
            "phase": "Pending",
            "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable" }],
        }));
        assert_eq!(
            start_blocker(&pod).as_deref(),
            Some("pod cannot be scheduled")
        );
    }

    #[test]
    fn blocker_messages_are_truncated_like_failures() {
        let long = "y".repeat(900);
        let pod = pod(json!({
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": long,
            }],
        }));
        let message = start_blocker(&pod).unwrap();
        assert!(message.ends_with('…'));
        assert_eq!(
            message.chars().count(),
            "pod cannot be scheduled: ".len() + 501
        );
    }

    #[test]
    fn a_blocked_container_outranks_the_scheduler() {
        let pod = pod(json!({
            "phase": "Pending",
            "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable" }],
            "containerStatuses": [waiting("session", "ErrImagePull", None)],
        }));
        assert_eq!(
            start_blocker(&pod).as_deref(),
            Some("container \"session\" waiting: ErrImagePull")
        );
    }
}
