//! One session's pod, from creation (or adoption) to its terminal status.

pub(crate) mod adoption;
pub(crate) mod marks;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use runner_api::ports::tcp_ports;
use runner_core::observe::Observer;
use runner_core::reach::Reach;
use runner_core::tasks::OwnedTasks;
use runner_core::types::{PortMapping, RunPhase, RunStatus};
use runner_core::{BackendSession, SessionSink, StartError, StartStage, StopError};
use tokio::sync::{OnceCell, watch};
use tracing::{debug, info, warn};

use crate::bundle_store::BundleStore;
use crate::cluster::api_error::{api_reason, is_not_found, is_transient, is_unavailable};
use crate::images::telo::TeloPins;
use crate::pod::env_secret::EnvSecrets;
use crate::pod::event_informer::{EventInformer, EventQueue};
use crate::pod::informer::{PodInformer, PodState};
use crate::pod::progress::{Line, ProgressOrder, Stage, event_line};
use crate::pod::session_record::pod_name;
use crate::pod::spec::INSPECT_PORT;
use crate::pod::status::{
    PodPhase, container_exit_code, is_finished, pod_failure_message, provision_line,
    start_blocker_naming, terminal_status_within,
};
use crate::routing::SessionRouter;
use crate::routing::endpoints::endpoints_for;
use crate::terminal::{self, Terminal};

/// How long, after the pod finished, its last output may take to arrive
/// before the terminal status is reported anyway. The attach stream ends when
/// the container does, so this is only a safety net; it is generous because a
/// loaded runner can take seconds to relay a burst of output, and a terminal
/// status sent before the output would cut it off for every client.
const OUTPUT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// A pod that vanished (or began terminating) without the runner asking.
pub(crate) const DELETED_OUTSIDE: &str = "the session pod was deleted outside the runner";
/// Attempts at deleting a pod when the apiserver fails transiently.
const DELETE_ATTEMPTS: u32 = 4;
/// The wait before the n-th retry is n times this.
const DELETE_RETRY_DELAY: Duration = Duration::from_millis(100);
/// How long past its grace period a stopped pod may take to finish (a slow
/// kubelet, a lost watch event) before it is deleted at once and the session
/// reported stopped anyway.
const STOP_SETTLE: Duration = Duration::from_secs(10);
/// How long a DELETE waits for the apiserver to take the pod deletion
/// before it answers and finishes the deletion in the background.
const STOP_ANSWER_BOUND: Duration = Duration::from_secs(2);
/// Retries of a stop's deletion through an outage: the first wait, and the
/// longest one it doubles up to.
const OUTAGE_RETRY_FIRST: Duration = Duration::from_millis(250);
const OUTAGE_RETRY_MAX: Duration = Duration::from_secs(5);

/// What every session of one backend shares.
pub struct SessionContext {
    pub pods: Api<Pod>,
    /// Where the env values no pod may show are kept, one Secret per pod.
    pub env_secrets: EnvSecrets,
    pub pod_informer: Arc<PodInformer>,
    pub event_informer: Arc<EventInformer>,
    pub bundles: Arc<BundleStore>,
    pub http: reqwest::Client,
    pub start_deadline: Duration,
    /// The grace period of a stop's pod deletion (`RUNNER_STOP_GRACE_SECONDS`).
    pub stop_grace: Duration,
    /// `None` on a logs-only runner.
    pub router: Option<Arc<SessionRouter>>,
    /// The backend's task owner, where every session's background work runs.
    pub tasks: OwnedTasks,
}

/// The declared shape of a session, as needed once its pod runs.
#[derive(Debug, Clone)]
pub struct SessionShape {
    pub session_id: String,
    /// `telo-run-<id>`, or the warm pod the session claimed.
    pub pod_name: String,
    pub ports: Vec<PortMapping>,
    pub inspect: bool,
    /// The memory limit its containers run under, for the failure message
    /// of an OOM kill.
    pub memory_limit: String,
}

/// Unsubscribes a session from the shared informers when it is done with them.
struct SubscriptionGuard {
    ctx: Arc<SessionContext>,
    session_id: String,
    pod_name: String,
}

impl Drop for SubscriptionGuard {
    fn drop(&mut self) {
        self.ctx.pod_informer.unsubscribe(&self.session_id);
        self.ctx.event_informer.unsubscribe_pod(&self.pod_name);
    }
}

/// Subscribe before the pod exists, so no event about it is missed.
pub struct PodSubscription {
    pods: watch::Receiver<PodState>,
    events: EventQueue,
    /// The pod was not known when the session subscribed: it is one the
    /// runner is about to create, not one it adopts.
    fresh: bool,
    /// Containers of the pod that run a chosen telo release; a start that
    /// fails on their image names the release.
    telo_pins: TeloPins,
    _guard: SubscriptionGuard,
}

pub fn subscribe_session(ctx: &Arc<SessionContext>, session_id: &str) -> PodSubscription {
    subscribe_pod(ctx, session_id, &pod_name(session_id))
}

/// [`subscribe_session`] for a session whose pod is named `pod_name`. One
/// subscription per session at a time: dropping it ends every receiver of
/// the session's pod state.
pub fn subscribe_pod(
    ctx: &Arc<SessionContext>,
    session_id: &str,
    pod_name: &str,
) -> PodSubscription {
    let pods = ctx.pod_informer.subscribe(session_id);
    let fresh = matches!(*pods.borrow(), PodState::Unknown);
    PodSubscription {
        pods,
        fresh,
        events: ctx.event_informer.subscribe_pod(pod_name),
        telo_pins: TeloPins::default(),
        _guard: SubscriptionGuard {
            ctx: ctx.clone(),
            session_id: session_id.to_owned(),
            pod_name: pod_name.to_owned(),
        },
    }
}

impl PodSubscription {
    /// Another reader of the pod's state, valid while this subscription is.
    pub fn pods(&self) -> watch::Receiver<PodState> {
        self.pods.clone()
    }

    /// The pod's containers that run a chosen telo release.
    pub fn naming_telo(mut self, pins: TeloPins) -> Self {
        self.telo_pins = pins;
        self
    }
}

pub(crate) enum Arrival {
    Running(Arc<Pod>),
    /// The pod finished before it was ever seen running.
    Finished(Arc<Pod>),
}

/// Wait for the pod to run, reporting progress; then attach and follow it to its end.
pub async fn bring_up(
    ctx: Arc<SessionContext>,
    shape: SessionShape,
    sink: SessionSink,
    mut subscription: PodSubscription,
) -> Result<Arc<KubeSession>, StartError> {
    let name = shape.pod_name.clone();
    let arrival = match wait_until_running(&ctx, &sink, &mut subscription).await {
        Ok(arrival) => arrival,
        Err(failure) => {
            ctx.bundles.drop_bundle(&shape.session_id);
            // The start error is what the client must see; a failing delete is
            // only logged (the reference let it replace the real cause).
            if let Err(err) = delete_pod(&ctx.pods, &name).await {
                warn!(pod = %name, error = %err, "could not delete a pod that failed to start");
            }
            return Err(failure);
        }
    };
    let session = Arc::new(KubeSession {
        ctx: ctx.clone(),
        name: name.clone(),
        sink: sink.clone(),
        terminal: OnceCell::new(),
        deleted: Arc::new(AtomicBool::new(false)),
        detached: AtomicBool::new(false),
    });
    match arrival {
        Arrival::Finished(pod) => {
            // It ran and ended between two looks: report what it did. Nothing
            // was published for it, so no URL is claimed either.
            sink.status(running_status(&shape, None));
            let history = terminal::read_history(&ctx.pods, &name, &sink).await;
            if !history.is_empty() {
                sink.output(Bytes::from(history));
            }
            sink.status(terminal_status_within(
                &pod,
                sink.is_user_stopped(),
                Some(&shape.memory_limit),
            ));
            ctx.bundles.drop_bundle(&shape.session_id);
            cleanup_finished(&ctx.pods, &name).await;
        }
        Arrival::Running(pod) => {
            // Attached before `running` is announced, so a client that starts
            // typing on `running` reaches the workload.
            let _ = session
                .terminal
                .set(terminal::attach(&ctx.pods, &name, &sink).await);
            let pod_ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok());
            // Published before `running`, so the URLs it announces exist.
            let routes = match &ctx.router {
                Some(router) if !shape.ports.is_empty() => {
                    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                    Some(
                        router
                            .publish_session(&shape.session_id, &shape.ports, &name, uid)
                            .await,
                    )
                }
                _ => None,
            };
            let base_domain = ctx.router.as_ref().map(|router| router.base_domain());
            sink.status(running_status(&shape, base_domain));
            start_observers(&ctx, &shape, &sink, pod_ip);
            if let Some(routes) = routes {
                routes.follow(sink.clone());
            }
            ctx.tasks
                .spawn(follow_pod(session.clone(), shape, subscription));
        }
    }
    Ok(session)
}

/// `base_domain` is set when the session is routed: its tcp ports get their
/// hosts and URLs (whether each route works is told by `route` events).
fn running_status(shape: &SessionShape, base_domain: Option<&str>) -> RunStatus {
    RunStatus::Running {
        endpoints: Some(endpoints_for(base_domain, &shape.session_id, &shape.ports)),
        inspect_url: None,
        agent: None,
    }
}

pub(crate) async fn wait_until_running(
    ctx: &SessionContext,
    sink: &SessionSink,
    subscription: &mut PodSubscription,
) -> Result<Arrival, StartError> {
    let deadline = tokio::time::sleep(ctx.start_deadline);
    tokio::pin!(deadline);
    let stop = sink.stop_requested();
    let mut order = ProgressOrder::default();
    let mut show = |line: Line| {
        for message in order.offer(line) {
            sink.progress(RunPhase::Provision, message, None);
        }
    };
    // What the pod status says is repeated on every update, so it is
    // reported when it changes; Kubernetes Events are news each time.
    let mut last_status_message: Option<String> = None;
    // A pod the runner just created starts by being scheduled, whichever
    // informer reports first.
    if subscription.fresh {
        show(Line {
            stage: Some(Stage::Scheduling),
            message: "Scheduling".to_owned(),
        });
        last_status_message = Some("Scheduling".to_owned());
    }
    loop {
        let state = subscription.pods.borrow_and_update().clone();
        match state {
            PodState::Present(pod) => {
                if let Some(blocker) = start_blocker_naming(&pod, &subscription.telo_pins) {
                    return Err(start_failed(blocker));
                }
                match PodPhase::of(&pod) {
                    Some(PodPhase::Running) => return Ok(Arrival::Running(pod)),
                    Some(PodPhase::Succeeded) => return Ok(Arrival::Finished(pod)),
                    // Its container ran and ended (seen only now: a quick
                    // workload, or one that finished while no runner was up):
                    // that is the workload's outcome, not a failed start.
                    Some(PodPhase::Failed) if container_exit_code(&pod).is_some() => {
                        return Ok(Arrival::Finished(pod));
                    }
                    Some(PodPhase::Failed) => {
                        return Err(start_failed(pod_failure_message(Some(&pod))));
                    }
                    _ => {
                        if let Some(line) = provision_line(&pod)
                            && last_status_message.as_deref() != Some(line.message.as_str())
                        {
                            last_status_message = Some(line.message.clone());
                            show(line);
                        }
                    }
                }
            }
            PodState::Gone => {
                return Err(start_failed(
                    "pod disappeared before reaching Running".into(),
                ));
            }
            PodState::Unknown => {}
        }
        tokio::select! {
            changed = subscription.pods.changed() => {
                if changed.is_err() {
                    return Err(start_failed("the runner stopped watching the pod".into()));
                }
            }
            Some(event) = subscription.events.recv() => {
                if let Some(line) = event_line(&event) {
                    show(line);
                }
            }
            () = &mut deadline => {
                return Err(start_failed("pod did not reach Running within the start deadline".into()));
            }
            () = stop.cancelled() => return Err(StartError::cancelled()),
        }
    }
}

pub(crate) fn start_failed(message: String) -> StartError {
    StartError::new(StartStage::Start, format!("pod failed to start: {message}"))
}

fn start_observers(
    ctx: &Arc<SessionContext>,
    shape: &SessionShape,
    sink: &SessionSink,
    pod_ip: Option<std::net::IpAddr>,
) {
    let tcp_ports = tcp_ports(&shape.ports);
    let ended = sink.ended();
    match pod_ip {
        Some(ip) => Observer {
            tasks: &ctx.tasks,
            sink,
            reach: Reach::Address(ip),
            stop: &ended,
        }
        .run_session(tcp_ports, shape.inspect.then_some(INSPECT_PORT)),
        None => {
            for port in tcp_ports {
                sink.reachability(port, runner_core::types::ReachabilityState::Unreachable);
            }
            if shape.inspect {
                sink.output(Bytes::from_static(
                    b"\r\n[runner] debug stream unavailable: pod IP unknown\r\n",
                ));
            }
        }
    }
}

/// Follow the running pod to its end and report exactly one terminal status.
async fn follow_pod(
    session: Arc<KubeSession>,
    shape: SessionShape,
    mut subscription: PodSubscription,
) {
    let sink = session.sink.clone();
    let ended = sink.ended();
    // Armed once the pod is terminating because of our own stop: its
    // containers get their grace period to exit, and not much more.
    let mut stop_bound: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let outcome = loop {
        let state = subscription.pods.borrow_and_update().clone();
        match state {
            PodState::Present(pod) => {
                let terminating = pod.metadata.deletion_timestamp.is_some();
                let ours = session.deleted.load(Ordering::Acquire);
                if is_finished(&pod) || (terminating && !ours) {
                    break Some(pod);
                }
                if terminating && stop_bound.is_none() {
                    stop_bound = Some(Box::pin(tokio::time::sleep(
                        session.ctx.stop_grace.saturating_add(STOP_SETTLE),
                    )));
                }
            }
            PodState::Gone => break None,
            PodState::Unknown => {}
        }
        let overdue = async {
            match stop_bound.as_mut() {
                Some(bound) => bound.as_mut().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = subscription.pods.changed() => if changed.is_err() { break None },
            () = overdue => {
                warn!(pod = %session.name, "stopped pod still terminating after its grace period; deleting it now");
                if let Err(err) = delete_pod(&session.ctx.pods, &session.name).await {
                    warn!(pod = %session.name, error = %err, "could not delete an overdue stopped pod");
                }
                break None;
            }
            // The registry ended the session without us (shutdown gave up
            // waiting): nothing may keep running unobserved — unless the
            // runner left it to its successor, which adopts it.
            () = ended.cancelled() => {
                drop(subscription);
                if session.detached.load(Ordering::Acquire) {
                    debug!(pod = %session.name, "left running for the next runner");
                    return;
                }
                if let Err(err) = delete_pod(&session.ctx.pods, &session.name).await {
                    warn!(pod = %session.name, error = %err, "could not delete the pod of an ended session");
                }
                return;
            }
        }
    };
    drop(subscription);
    if let Some(terminal) = session.terminal.get()
        && tokio::time::timeout(OUTPUT_DRAIN_TIMEOUT, terminal.wait_output_done())
            .await
            .is_err()
    {
        debug!(pod = %session.name, "output still open after the pod finished");
    }
    let stopped_by_us = session.deleted.load(Ordering::Acquire);
    let deleted_by_someone_else = !stopped_by_us
        && outcome
            .as_ref()
            .is_some_and(|pod| pod.metadata.deletion_timestamp.is_some());
    let gone = outcome.is_none();
    let status = match outcome {
        _ if sink.is_user_stopped() || stopped_by_us => RunStatus::Stopped,
        // Its containers were killed by the deletion: the exit code says
        // nothing about the workload.
        _ if deleted_by_someone_else => RunStatus::failed(DELETED_OUTSIDE),
        Some(pod) => terminal_status_within(&pod, false, Some(&shape.memory_limit)),
        None => RunStatus::failed(DELETED_OUTSIDE),
    };
    info!(session_id = %shape.session_id, status = status.kind(), "session pod finished");
    sink.status(status);
    session.ctx.bundles.drop_bundle(&shape.session_id);
    // A pod already being deleted (by a stop, or from outside) or gone needs
    // no second request.
    if !deleted_by_someone_else && !gone && !stopped_by_us {
        cleanup_finished(&session.ctx.pods, &session.name).await;
    }
}

/// A finished pod has told us everything; delete it so the namespace (and its
/// quota) does not fill with completed pods. Routing objects go with it.
async fn cleanup_finished(pods: &Api<Pod>, name: &str) {
    if let Err(err) = delete_pod(pods, name).await {
        warn!(pod = name, error = %err, "could not delete a finished session pod");
    }
}

/// Delete now (grace 0); an already-gone pod is fine.
///
/// Boxed: a session's pod follower awaits it, and an apiserver request built
/// inline would make every live session's task kilobytes larger for a call
/// it makes once, at its end.
pub fn delete_pod<'a>(pods: &'a Api<Pod>, name: &'a str) -> BoxFuture<'a, Result<(), kube::Error>> {
    delete_pod_within(pods, name, Duration::ZERO).boxed()
}

/// Delete, giving the containers `grace` between SIGTERM and the kill. A
/// transient failure (a 5xx, a 429, no answer) is retried a few times: a pod
/// whose delete failed once would otherwise be left behind (a finished one
/// for good).
async fn delete_pod_within(
    pods: &Api<Pod>,
    name: &str,
    grace: Duration,
) -> Result<(), kube::Error> {
    let grace_period_seconds = u32::try_from(grace.as_secs()).unwrap_or(u32::MAX);
    let mut attempt = 1;
    loop {
        match pods
            .delete(
                name,
                &DeleteParams {
                    grace_period_seconds: Some(grace_period_seconds),
                    ..DeleteParams::default()
                },
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(err) if is_not_found(&err) => return Ok(()),
            Err(err) if attempt < DELETE_ATTEMPTS && is_transient(&err) => {
                debug!(pod = name, error = %err, attempt, "pod delete failed; retrying");
                tokio::time::sleep(DELETE_RETRY_DELAY * attempt).await;
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

impl KubeSession {
    /// Retries a stop's pod deletion until the apiserver takes it, the pod
    /// is gone, or the session ended. A refusal once the apiserver answers
    /// again is told to the session's clients, and the session runs on.
    fn delete_through_the_outage(&self) {
        let pods = self.ctx.pods.clone();
        let name = self.name.clone();
        let grace = self.ctx.stop_grace;
        let deleted = self.deleted.clone();
        let sink = self.sink.clone();
        let ended = sink.ended();
        self.ctx.tasks.spawn(async move {
            let mut delay = OUTAGE_RETRY_FIRST;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = ended.cancelled() => return,
                }
                let attempt =
                    tokio::time::timeout(STOP_ANSWER_BOUND, delete_pod_within(&pods, &name, grace))
                        .await;
                match attempt {
                    Ok(Ok(())) => {
                        info!(pod = %name, "deleted the stopped session's pod after the outage");
                        return;
                    }
                    Ok(Err(err)) if !is_unavailable(&err) => {
                        warn!(pod = %name, error = %err, "the stopped session's pod could not be deleted");
                        deleted.store(false, Ordering::Release);
                        sink.output(Bytes::from(format!(
                            "\r\n[runner] could not stop the session: could not delete the session pod: {}; stop it again\r\n",
                            api_reason(&err)
                        )));
                        return;
                    }
                    _ => delay = (delay * 2).min(OUTAGE_RETRY_MAX),
                }
            }
        });
    }
}

pub struct KubeSession {
    ctx: Arc<SessionContext>,
    name: String,
    sink: SessionSink,
    terminal: OnceCell<Terminal>,
    /// Set once a stop deleted the pod (or is deleting it through an
    /// outage), so it is not deleted twice.
    deleted: Arc<AtomicBool>,
    /// Set when the runner exits leaving the pod to its successor.
    detached: AtomicBool,
}

impl KubeSession {
    /// Whether the session's terminal has a live attach: what is written to
    /// its stdin reaches the container.
    pub fn terminal_attached(&self) -> bool {
        self.terminal.get().is_some_and(Terminal::is_attached)
    }
}

#[async_trait]
impl BackendSession for KubeSession {
    fn write_stdin(&self, bytes: Bytes) {
        if let Some(terminal) = self.terminal.get() {
            terminal.write_stdin(bytes);
        }
    }

    fn resize(&self, cols: u16, rows: u16) {
        if let Some(terminal) = self.terminal.get() {
            terminal.resize(cols, rows);
        }
    }

    /// Deletes the pod with the stop grace period: its containers get
    /// SIGTERM, and the kernel's teardown output still reaches clients. The
    /// pod follower reports `stopped` once the pod finished.
    async fn stop(&self) -> Result<(), StopError> {
        // Marked first, so the pod follower never takes our own deletion for
        // one from outside.
        if self.deleted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let attempt = tokio::time::timeout(
            STOP_ANSWER_BOUND,
            delete_pod_within(&self.ctx.pods, &self.name, self.ctx.stop_grace),
        )
        .await;
        match attempt {
            Ok(Ok(())) => Ok(()),
            // The apiserver is down or not answering: the client is not kept
            // waiting through the outage; the delete is finished as soon as
            // the apiserver is back, and `stopped` follows it.
            Ok(Err(err)) if is_unavailable(&err) => {
                info!(pod = %self.name, error = %err, "the apiserver is unavailable; deleting the pod once it is back");
                self.delete_through_the_outage();
                Ok(())
            }
            Err(_) => {
                info!(pod = %self.name, "the apiserver is not answering; deleting the pod once it does");
                self.delete_through_the_outage();
                Ok(())
            }
            Ok(Err(err)) => {
                self.deleted.store(false, Ordering::Release);
                Err(StopError {
                    message: format!("could not delete the session pod: {}", api_reason(&err)),
                })
            }
        }
    }

    fn detach(&self) {
        self.detached.store(true, Ordering::Release);
    }

    async fn hand_over(&self, marks: Vec<runner_core::session::OutputMarks>) {
        self.detach();
        if marks.is_empty() {
            return;
        }
        if let Err(err) = marks::leave(&self.ctx.pods, &self.name, &marks).await {
            warn!(pod = %self.name, error = %err, "could not leave the output marks on the pod; a client resuming the session is told of a gap");
        }
    }
}
