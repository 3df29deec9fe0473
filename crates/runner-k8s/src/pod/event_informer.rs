//! One informer over the Kubernetes Events of the session namespace, feeding each
//! session's `progress` stream with what the scheduler and kubelet say about
//! its pod ("Pulling image …", "FailedScheduling: …").
//!
//! Events carry no labels of ours, so they are matched to sessions by the name
//! of the pod they are about. They are hints, not state: the shared
//! [`Informer`] keeps them, and each session gets the ones it has not been
//! told yet through a bounded queue, however often a re-list repeats them.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Event as KubeEvent;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::informer::{Informer, KeyObjects, Kind, Subscriber};
use crate::pod::session_record::pod_name;

/// How many unread events a session may have queued; more are dropped (they
/// are progress hints, never state).
const PER_SESSION_QUEUE: usize = 64;

/// Which of the pod's containers an Event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    Main,
}

impl ContainerKind {
    /// From the Event's `involvedObject.fieldPath`
    /// (`spec.initContainers{bundle-fetch}`, `spec.containers{session}`).
    pub fn of_field_path(field_path: &str) -> Option<Self> {
        if field_path.starts_with("spec.initContainers") {
            Some(ContainerKind::Init)
        } else if field_path.starts_with("spec.containers") {
            Some(ContainerKind::Main)
        } else {
            None
        }
    }
}

/// What a session is told about one Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// `Normal` or `Warning`.
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// The container it is about (`None`: the pod).
    pub container: Option<ContainerKind>,
}

/// One session's queue of Events. Boxed: the queue's first block of slots
/// is allocated with the queue and lives as long as the session, and most
/// sessions are told a handful of Events in all.
pub type EventQueue = mpsc::Receiver<Box<PodEvent>>;

/// One session listening for the Events about its pod.
pub struct EventSubscriber {
    tx: mpsc::Sender<Box<PodEvent>>,
    /// Event uid and count already delivered, so a re-list does not repeat them.
    delivered: HashSet<(String, i32)>,
}

/// The shared Event informer, keyed by the name of the pod an Event is about.
pub type EventInformer = Informer<KubeEvent, EventSubscriber>;

fn pod_of(event: &KubeEvent) -> Option<String> {
    event.involved_object.name.clone()
}

/// The uid and count of an Event: a repeated Event keeps its uid and counts up.
fn occurrence(event: &KubeEvent) -> (String, i32) {
    (
        event.metadata.uid.clone().unwrap_or_default(),
        event.count.unwrap_or(1),
    )
}

const EVENTS: Kind<KubeEvent> = Kind {
    what: "events",
    readyz_name: "the event watch",
    listing: "pod events",
    key: pod_of,
    slim: slim_event,
};

/// Keeps what the cache and its subscribers read of an Event: its name,
/// namespace and uid, the pod and container it is about, its type, reason,
/// message and count. Every session's pod has a few Events held for as long
/// as the cache keeps them, and their timestamps, sources, reporters and
/// labels are read by no one.
fn slim_event(event: &mut KubeEvent) {
    let KubeEvent {
        metadata,
        involved_object,
        action,
        event_time,
        first_timestamp,
        last_timestamp,
        related,
        reporting_component,
        reporting_instance,
        series,
        source,
        count: _,
        message: _,
        reason: _,
        type_: _,
    } = event;
    *metadata = kube::core::ObjectMeta {
        name: metadata.name.take(),
        namespace: metadata.namespace.take(),
        uid: metadata.uid.take(),
        resource_version: metadata.resource_version.take(),
        ..kube::core::ObjectMeta::default()
    };
    *involved_object = k8s_openapi::api::core::v1::ObjectReference {
        kind: involved_object.kind.take(),
        name: involved_object.name.take(),
        field_path: involved_object.field_path.take(),
        ..k8s_openapi::api::core::v1::ObjectReference::default()
    };
    *action = None;
    *event_time = None;
    *first_timestamp = None;
    *last_timestamp = None;
    *related = None;
    *reporting_component = None;
    *reporting_instance = None;
    *series = None;
    *source = None;
}

impl Subscriber<KubeEvent> for EventSubscriber {
    fn update(&mut self, events: &KeyObjects<KubeEvent>) {
        for event in events.values() {
            if !self.delivered.insert(occurrence(event)) {
                continue;
            }
            let _ = self.tx.try_send(Box::new(PodEvent {
                kind: event.type_.clone().unwrap_or_default(),
                reason: event.reason.clone().unwrap_or_default(),
                message: event.message.clone().unwrap_or_default(),
                container: event
                    .involved_object
                    .field_path
                    .as_deref()
                    .and_then(ContainerKind::of_field_path),
            }));
        }
    }
}

impl EventInformer {
    pub fn spawn(
        client: Client,
        namespace: &str,
        restarts: runner_core::metrics::Counter,
        stop: CancellationToken,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let api: Api<KubeEvent> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().fields("involvedObject.kind=Pod");
        Self::start(api, config, EVENTS, restarts, stop)
    }

    /// Events about the session's pod from now on: those already known count
    /// as told.
    pub fn subscribe(&self, session_id: &str) -> EventQueue {
        self.subscribe_pod(&pod_name(session_id))
    }

    /// The events of the pod named `pod_name` (a watch pod's name is not
    /// the run pod's).
    pub fn subscribe_pod(&self, pod_name: &str) -> EventQueue {
        let (tx, rx) = mpsc::channel(PER_SESSION_QUEUE);
        self.with_subscriber(pod_name, |events, slot| {
            slot.insert_entry(EventSubscriber {
                tx,
                delivered: events.values().map(|event| occurrence(event)).collect(),
            });
        });
        rx
    }

    pub fn unsubscribe(&self, session_id: &str) {
        self.unsubscribe_pod(&pod_name(session_id));
    }

    pub fn unsubscribe_pod(&self, pod_name: &str) {
        self.drop_subscriber(pod_name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::core::ObjectMeta;
    use kube::runtime::watcher::Event;

    fn event(name: &str, count: i32) -> KubeEvent {
        KubeEvent {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("sessions".into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                name: Some(pod_name("abc")),
                field_path: Some("spec.containers{session}".into()),
                ..ObjectReference::default()
            },
            reason: Some(name.into()),
            count: Some(count),
            ..KubeEvent::default()
        }
    }

    fn relist(events: &EventInformer, listed: &[KubeEvent]) {
        events.apply(Event::Init);
        for event in listed {
            events.apply(Event::InitApply(event.clone()));
        }
        events.apply(Event::InitDone);
    }

    fn reasons(rx: &mut EventQueue) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|event| event.reason)
            .collect()
    }

    #[test]
    fn a_stored_event_keeps_what_its_readers_read_and_nothing_else() {
        let mut full = event("Pulling", 3);
        full.type_ = Some("Normal".into());
        full.message = Some("Pulling image".into());
        full.involved_object.kind = Some("Pod".into());
        full.involved_object.uid = Some("pod-uid".into());
        full.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
        full.reporting_component = Some("kubelet".into());
        full.source = Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("kubelet".into()),
            host: Some("node".into()),
        });
        let mut slim = full.clone();
        slim_event(&mut slim);
        let mut expected = event("Pulling", 3);
        expected.type_ = full.type_.clone();
        expected.message = full.message.clone();
        expected.involved_object.kind = Some("Pod".into());
        assert_eq!(slim, expected);
        assert_eq!(occurrence(&slim), occurrence(&full));
        assert_eq!(pod_of(&slim), pod_of(&full));
    }

    #[test]
    fn a_relist_repeats_no_event_and_a_repeated_event_is_told_again() {
        let events = EventInformer::new(EVENTS, (), runner_core::metrics::Counter::default());
        relist(&events, &[event("Old", 1)]);
        let mut rx = events.subscribe("abc");
        assert!(reasons(&mut rx).is_empty(), "only events from now on");

        events.apply(Event::Apply(event("Pulling", 1)));
        relist(&events, &[event("Old", 1), event("Pulling", 1)]);
        assert_eq!(reasons(&mut rx), ["Pulling"]);

        relist(
            &events,
            &[event("Old", 1), event("Pulling", 2), event("Started", 1)],
        );
        assert_eq!(reasons(&mut rx), ["Pulling", "Started"]);

        events.unsubscribe("abc");
        events.apply(Event::Apply(event("Killing", 1)));
        assert!(rx.try_recv().is_err());
    }
}
