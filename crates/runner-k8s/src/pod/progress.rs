//! A starting pod's `progress` lines in the order the pod goes through them.
//!
//! They come from two watches that race each other: the pod's status ("the
//! pod is scheduling", "the init container is running") and the Kubernetes
//! Events the scheduler and kubelet write ("Pulling image …", "Container
//! image … already present"). Relayed as they arrive, the same start read
//! differently from run to run: "already present" before "Scheduling",
//! "Delivering application" before the image it runs was pulled.
//!
//! A pod goes through its start in a fixed order — scheduled, then each
//! container's image pulled before the container is set up, the init
//! container before the session container — so each line gets its place in
//! that order ([`Stage`]), and:
//!
//! * a line whose stage is behind one already shown is stale and dropped
//!   (a status update that arrives after the events that followed it);
//! * a status line about a container being set up waits until that
//!   container's image is pulled: the kubelet reports `PodInitializing` or
//!   `ContainerCreating` from the moment it takes the container in hand,
//!   pull included, so shown at once it would precede the pull it contains;
//! * what has no place in the order — warnings, back-offs, failures, reasons
//!   the runner does not know — is news and shown at once.
//!
//! The first line of a pod the runner just created is `Scheduling`, shown
//! before either informer reports, since that is where every new pod starts.

use crate::pod::event_informer::{ContainerKind, PodEvent};

/// Where in a pod's start a progress line belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    Scheduling,
    InitPulling,
    InitPulled,
    /// The init container (the bundle download) set up and running.
    InitSetup,
    MainPulling,
    MainPulled,
    /// The session container being created.
    MainSetup,
}

impl Stage {
    pub fn pulling(container: ContainerKind) -> Self {
        match container {
            ContainerKind::Init => Stage::InitPulling,
            ContainerKind::Main => Stage::MainPulling,
        }
    }

    pub fn pulled(container: ContainerKind) -> Self {
        match container {
            ContainerKind::Init => Stage::InitPulled,
            ContainerKind::Main => Stage::MainPulled,
        }
    }

    pub fn setup(container: ContainerKind) -> Self {
        match container {
            ContainerKind::Init => Stage::InitSetup,
            ContainerKind::Main => Stage::MainSetup,
        }
    }

    /// The stage that must be reached before a line of this one is shown.
    fn waits_for(self) -> Option<Stage> {
        match self {
            Stage::InitSetup => Some(Stage::InitPulled),
            Stage::MainSetup => Some(Stage::MainPulled),
            _ => None,
        }
    }
}

/// One progress line and its place in the start (`None`: news, shown
/// whenever it comes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub stage: Option<Stage>,
    pub message: String,
}

/// Puts one pod's progress lines in start order.
#[derive(Debug, Default)]
pub struct ProgressOrder {
    reached: Option<Stage>,
    /// Set-up lines waiting for their container's image, by stage.
    held: Vec<Line>,
}

impl ProgressOrder {
    /// Takes a line; returns what to show now, in order.
    pub fn offer(&mut self, line: Line) -> Vec<String> {
        let Some(stage) = line.stage else {
            return vec![line.message];
        };
        if self.reached.is_some_and(|reached| stage < reached) {
            return Vec::new();
        }
        if let Some(first) = stage.waits_for()
            && self.reached.is_none_or(|reached| reached < first)
        {
            self.held.retain(|held| held.stage != Some(stage));
            self.held.push(line);
            return Vec::new();
        }
        self.reached = Some(stage);
        let mut shown = vec![line.message];
        // What waited for this stage, in stage order.
        self.held.sort_by_key(|held| held.stage);
        let held = std::mem::take(&mut self.held);
        for waiting in held {
            match (waiting.stage, waiting.stage.and_then(Stage::waits_for)) {
                (Some(s), _) if s < stage => {}
                (Some(s), Some(first)) if first <= stage => {
                    self.reached = Some(s);
                    shown.push(waiting.message);
                }
                _ => self.held.push(waiting),
            }
        }
        shown
    }
}

/// The progress line a Kubernetes Event about the pod is worth, if any.
pub fn event_line(event: &PodEvent) -> Option<Line> {
    if event.message.is_empty() {
        return None;
    }
    let stage = match (event.reason.as_str(), event.container) {
        // Said better by the pod status itself.
        ("Scheduled" | "Created" | "Started" | "Killing", _) => return None,
        ("Pulling", Some(container)) => Some(Stage::pulling(container)),
        ("Pulled", Some(container)) => Some(Stage::pulled(container)),
        _ => None,
    };
    Some(Line {
        stage,
        message: event.message.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(stage: Stage, message: &str) -> Line {
        Line {
            stage: Some(stage),
            message: message.to_owned(),
        }
    }

    fn news(message: &str) -> Line {
        Line {
            stage: None,
            message: message.to_owned(),
        }
    }

    /// Every arrival order of one start shows the same lines in the same
    /// order, as long as each informer keeps its own order. (`Scheduling` is
    /// shown first for a pod the runner created; its repetition by the pod
    /// status is dropped as a repeat before it gets here.)
    #[test]
    fn a_start_reads_the_same_whichever_watch_is_first() {
        let events = [
            line(Stage::InitPulling, "Pulling busybox"),
            line(Stage::InitPulled, "Pulled busybox"),
            line(Stage::MainPulling, "Pulling node"),
            line(Stage::MainPulled, "Pulled node"),
        ];
        let expected = [
            "Scheduling",
            "Pulling busybox",
            "Pulled busybox",
            "Delivering application",
            "Pulling node",
            "Pulled node",
        ];
        // The init container's status line arrives after 0, 1 or 2 events.
        for after in 0..=2 {
            let mut order = ProgressOrder::default();
            let mut shown = order.offer(line(Stage::Scheduling, "Scheduling"));
            let mut arrivals: Vec<Line> = events.to_vec();
            arrivals.insert(after, line(Stage::InitSetup, "Delivering application"));
            for arrival in arrivals {
                shown.extend(order.offer(arrival));
            }
            assert_eq!(shown, expected, "status after {after} events");
        }
    }

    #[test]
    fn a_stale_line_is_dropped_and_news_always_shown() {
        let mut order = ProgressOrder::default();
        assert_eq!(
            order.offer(line(Stage::MainPulling, "Pulling")),
            ["Pulling"]
        );
        assert!(
            order
                .offer(line(Stage::Scheduling, "Scheduling"))
                .is_empty()
        );
        assert_eq!(order.offer(news("Back-off pulling")), ["Back-off pulling"]);
        assert_eq!(
            order.offer(line(Stage::MainPulling, "Pulling")),
            ["Pulling"]
        );
    }

    #[test]
    fn events_are_placed_by_reason_and_container() {
        let event = |reason: &str, field_path: &str| PodEvent {
            kind: "Normal".into(),
            reason: reason.into(),
            message: format!("{reason} message"),
            container: ContainerKind::of_field_path(field_path),
        };
        let stage = |reason, path| event_line(&event(reason, path)).map(|l| l.stage);
        assert_eq!(
            stage("Pulling", "spec.initContainers{bundle-fetch}"),
            Some(Some(Stage::InitPulling))
        );
        assert_eq!(
            stage("Pulled", "spec.containers{session}"),
            Some(Some(Stage::MainPulled))
        );
        assert_eq!(stage("BackOff", "spec.containers{session}"), Some(None));
        assert_eq!(stage("FailedScheduling", ""), Some(None));
        assert_eq!(stage("Started", "spec.containers{session}"), None);
    }

    #[test]
    fn creating_the_container_follows_its_pull() {
        let mut order = ProgressOrder::default();
        assert!(
            order
                .offer(line(Stage::MainSetup, "Creating container"))
                .is_empty()
        );
        assert_eq!(
            order.offer(line(Stage::MainPulling, "Pulling")),
            ["Pulling"]
        );
        assert_eq!(
            order.offer(line(Stage::MainPulled, "Pulled")),
            ["Pulled", "Creating container"]
        );
        // After its pull it shows at once.
        assert_eq!(
            order.offer(line(Stage::MainSetup, "Creating container")),
            ["Creating container"]
        );
    }
}
