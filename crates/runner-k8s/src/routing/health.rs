//! Route health (docs/contract.md §9.14): whether each published host is
//! actually served, told to the client as `route` events.
//!
//! Every host starts `pending`. A controller's answer moves it to
//! `programmed`, or to `unprogrammed` with the controller's reason; a host no
//! controller answers for within the ready timeout is reported `unprogrammed`
//! with the likely cause. Unlike the reference, the health follower does not stop at the
//! first answer: a controller that shows up late, or that later refuses a
//! route it had accepted, is reported too — the client sees the route's
//! current truth until the session ends. Never fatal to the session.

use std::time::Duration;

use kube::core::DynamicObject;
use runner_core::types::RouteState;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::informer::SessionRouteObjects;

/// What a routing object's status says about the route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No controller has answered (yet).
    Pending,
    Programmed,
    /// A controller refused it; the reason is the controller's.
    Refused(String),
}

/// A published host and the object whose status decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedRoute {
    pub host: String,
    pub port: u16,
    /// The Ingress (shared by every host of a session) or HTTPRoute name.
    pub object: String,
}

/// Where route states go (the session sink, or a test recorder).
pub trait RouteReport {
    fn route(&mut self, route: &PublishedRoute, state: RouteState, reason: Option<String>);
    /// Called once per session, the first time a route status could not be
    /// read.
    fn read_error(&mut self, reason: &str);
}

/// The health follower of one session's routes.
pub struct RouteHealth {
    pub routes: Vec<PublishedRoute>,
    pub verdict: fn(&DynamicObject) -> Verdict,
    /// How long a route may stay unanswered before it is `unprogrammed`.
    pub ready_timeout: Duration,
    /// Said of a route nobody answered for within the timeout.
    pub unclaimed_reason: String,
}

impl RouteHealth {
    /// Report until `stop` fires or the shared informer goes away.
    pub async fn run(
        self,
        mut objects: watch::Receiver<SessionRouteObjects>,
        read_error: impl Fn() -> Option<String>,
        report: &mut impl RouteReport,
        stop: CancellationToken,
    ) {
        if self.routes.is_empty() {
            return;
        }
        let mut reported: Vec<(RouteState, Option<String>)> = self
            .routes
            .iter()
            .map(|route| {
                report.route(route, RouteState::Pending, None);
                (RouteState::Pending, None)
            })
            .collect();
        let deadline = tokio::time::Instant::now() + self.ready_timeout;
        let mut timed_out = false;
        let mut read_error_told = false;
        loop {
            if stop.is_cancelled() {
                return;
            }
            let current = objects.borrow_and_update().clone();
            // Only looked up once a route is overdue: it explains why nothing
            // answered.
            let unanswered_reason = timed_out.then(|| match read_error() {
                Some(error) => {
                    if !read_error_told {
                        read_error_told = true;
                        report.read_error(&error);
                    }
                    format!("route status could not be read: {error}")
                }
                None => self.unclaimed_reason.clone(),
            });
            for (route, last) in self.routes.iter().zip(reported.iter_mut()) {
                let verdict = current
                    .get(&route.object)
                    .map_or(Verdict::Pending, |object| (self.verdict)(object));
                let next = match verdict {
                    Verdict::Programmed => (RouteState::Programmed, None),
                    Verdict::Refused(reason) => (RouteState::Unprogrammed, Some(reason)),
                    Verdict::Pending => match &unanswered_reason {
                        Some(reason) => (RouteState::Unprogrammed, Some(reason.clone())),
                        None => (RouteState::Pending, None),
                    },
                };
                if *last != next {
                    report.route(route, next.0, next.1.clone());
                    *last = next;
                }
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                changed = objects.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(deadline), if !timed_out => timed_out = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::gateway::http_route_verdict;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::Mutex;

    const TIMEOUT: Duration = Duration::from_secs(60);
    const UNCLAIMED: &str = "nobody claimed it";

    #[derive(Default)]
    struct Recorder {
        events: Vec<(String, RouteState, Option<String>)>,
        read_errors: Vec<String>,
    }

    impl RouteReport for Recorder {
        fn route(&mut self, route: &PublishedRoute, state: RouteState, reason: Option<String>) {
            self.events.push((route.host.clone(), state, reason));
        }
        fn read_error(&mut self, reason: &str) {
            self.read_errors.push(reason.to_owned());
        }
    }

    fn route(port: u16) -> PublishedRoute {
        PublishedRoute {
            host: format!("{port}-abc.telo.run"),
            port,
            object: format!("telo-run-abc-{port}"),
        }
    }

    fn health(ports: &[u16]) -> RouteHealth {
        RouteHealth {
            routes: ports.iter().map(|p| route(*p)).collect(),
            verdict: http_route_verdict,
            ready_timeout: TIMEOUT,
            unclaimed_reason: UNCLAIMED.into(),
        }
    }

    fn http_route(port: u16, accepted: Option<(&str, &str, &str)>) -> (String, Arc<DynamicObject>) {
        let status = match accepted {
            Some((status, reason, message)) => json!({"parents": [{"parentRef": {"name": "gw"},
                "conditions": [{"type": "Accepted", "status": status, "reason": reason, "message": message}]}]}),
            None => Value::Null,
        };
        let name = format!("telo-run-abc-{port}");
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name}, "spec": {}, "status": status,
        }))
        .unwrap();
        (name, Arc::new(object))
    }

    fn state(objects: &[(String, Arc<DynamicObject>)]) -> SessionRouteObjects {
        Arc::new(objects.iter().cloned().collect::<BTreeMap<_, _>>())
    }

    const ACCEPTED: Option<(&str, &str, &str)> = Some(("True", "Accepted", ""));

    fn pending(port: u16) -> (String, RouteState, Option<String>) {
        (format!("{port}-abc.telo.run"), RouteState::Pending, None)
    }

    fn programmed(port: u16) -> (String, RouteState, Option<String>) {
        (format!("{port}-abc.telo.run"), RouteState::Programmed, None)
    }

    fn unprogrammed(port: u16, reason: &str) -> (String, RouteState, Option<String>) {
        (
            format!("{port}-abc.telo.run"),
            RouteState::Unprogrammed,
            Some(reason.to_owned()),
        )
    }

    /// Runs the health follower in the background, recording what it reports.
    struct Running {
        objects: watch::Sender<SessionRouteObjects>,
        recorder: Arc<Mutex<Recorder>>,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<()>,
        read_error: Arc<Mutex<Option<String>>>,
    }

    struct Shared(Arc<Mutex<Recorder>>);
    impl RouteReport for Shared {
        fn route(&mut self, route: &PublishedRoute, state: RouteState, reason: Option<String>) {
            self.0.lock().unwrap().route(route, state, reason);
        }
        fn read_error(&mut self, reason: &str) {
            self.0.lock().unwrap().read_error(reason);
        }
    }

    fn start(health: RouteHealth) -> Running {
        let (objects, rx) = watch::channel(state(&[]));
        let recorder = Arc::new(Mutex::new(Recorder::default()));
        let stop = CancellationToken::new();
        let read_error = Arc::new(Mutex::new(None::<String>));
        let task = {
            let mut report = Shared(recorder.clone());
            let stop = stop.clone();
            let read_error = read_error.clone();
            tokio::spawn(async move {
                health
                    .run(
                        rx,
                        move || read_error.lock().unwrap().clone(),
                        &mut report,
                        stop,
                    )
                    .await;
            })
        };
        Running {
            objects,
            recorder,
            stop,
            task,
            read_error,
        }
    }

    impl Running {
        /// Let the health follower react to everything sent so far.
        async fn settle(&self) {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }

        fn events(&self) -> Vec<(String, RouteState, Option<String>)> {
            self.recorder.lock().unwrap().events.clone()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_host_is_pending_then_programmed() {
        let run = start(health(&[8080, 9090]));
        run.settle().await;
        run.objects
            .send_replace(state(&[http_route(8080, None), http_route(9090, None)]));
        run.settle().await;
        run.objects.send_replace(state(&[
            http_route(8080, ACCEPTED),
            http_route(9090, ACCEPTED),
        ]));
        run.settle().await;
        assert_eq!(
            run.events(),
            vec![
                pending(8080),
                pending(9090),
                programmed(8080),
                programmed(9090)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_passes_through_with_the_controllers_reason() {
        let run = start(health(&[8080, 9090]));
        run.objects.send_replace(state(&[
            http_route(8080, ACCEPTED),
            http_route(
                9090,
                Some(("False", "NotAllowedByListeners", "no listener")),
            ),
        ]));
        run.settle().await;
        assert_eq!(
            run.events(),
            vec![
                pending(8080),
                pending(9090),
                programmed(8080),
                unprogrammed(9090, "NotAllowedByListeners: no listener"),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_route_is_unprogrammed_at_the_deadline_and_programmed_if_claimed_later() {
        let run = start(health(&[8080]));
        run.objects.send_replace(state(&[http_route(8080, None)]));
        run.settle().await;
        tokio::time::sleep(TIMEOUT - Duration::from_secs(1)).await;
        run.settle().await;
        assert_eq!(run.events(), vec![pending(8080)]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        run.settle().await;
        assert_eq!(
            run.events(),
            vec![pending(8080), unprogrammed(8080, UNCLAIMED)]
        );
        run.objects
            .send_replace(state(&[http_route(8080, ACCEPTED)]));
        run.settle().await;
        assert_eq!(
            run.events(),
            vec![
                pending(8080),
                unprogrammed(8080, UNCLAIMED),
                programmed(8080)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_read_is_named_instead_of_blaming_the_controller_and_told_once() {
        let run = start(health(&[8080, 9090]));
        *run.read_error.lock().unwrap() = Some("the Kubernetes API could not be reached".into());
        tokio::time::sleep(TIMEOUT + Duration::from_secs(1)).await;
        run.settle().await;
        let reason = "route status could not be read: the Kubernetes API could not be reached";
        assert_eq!(
            run.events(),
            vec![
                pending(8080),
                pending(9090),
                unprogrammed(8080, reason),
                unprogrammed(9090, reason)
            ]
        );
        run.objects.send_replace(state(&[]));
        run.settle().await;
        assert_eq!(
            run.recorder.lock().unwrap().read_errors,
            vec!["the Kubernetes API could not be reached".to_owned()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_session_reports_nothing_more() {
        let run = start(health(&[8080]));
        run.settle().await;
        run.stop.cancel();
        run.settle().await;
        run.objects
            .send_replace(state(&[http_route(8080, ACCEPTED)]));
        tokio::time::sleep(TIMEOUT * 2).await;
        run.settle().await;
        assert_eq!(run.events(), vec![pending(8080)]);
        assert!(run.task.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn no_routes_means_no_events() {
        let run = start(health(&[]));
        run.settle().await;
        assert!(run.events().is_empty());
        assert!(run.task.is_finished());
    }
}
