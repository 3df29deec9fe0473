//! Several replicas of one installation (`RUNNER_PEER_TOKEN_FILE`): each
//! holds a `coordination.k8s.io/v1` Lease it renews, each session is owned
//! by the replica its objects name (`telo.run/replica` on a run pod, on a
//! watch session's record Secret), and a session whose owner's Lease
//! lapsed — or was deleted by a replica handing over on shutdown — is
//! claimed by a survivor with one conditional write.
//!
//! Timing, for a Lease of duration `d`:
//!
//! - a replica renews every `d/3`;
//! - a peer counts a Lease as lapsed once it has *seen* no renewal for `d`,
//!   measured on its own clock from when it saw the last one, so clocks
//!   that disagree cannot shorten a Lease;
//! - a replica stops acting on its sessions ([`Replicas::may_act`] turns
//!   false) once `d - d/5` has passed since the start of its last
//!   successful renewal. That start is before the apiserver stored the
//!   renewal, which is before any peer saw it, so the owner stops strictly
//!   before a peer can claim.

mod lease;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use runner_core::metrics::Metrics;
use runner_core::replicas::{Elsewhere, Owner, Peer, PeerToken, Replicas};
use runner_core::sync::lock;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cluster::api_error::{is_conflict, is_not_found};
use crate::cluster::informer::{Informer, KeyObjects, Kind, Subscriber};
use crate::config::ReplicationConfig;
use crate::pod::informer::PodInformer;
use crate::pod::labels::{
    MANAGED_BY_LABEL, MODE_LABEL, REPLICA_ANNOTATION, SESSION_ID_LABEL, WATCH_MODE,
};
use runner_core::tasks::OwnedTasks;

pub(crate) use lease::{ROLE_LABEL, ROLE_REPLICA, URL_ANNOTATION};

/// Writes a claim tries when the object keeps changing under it.
const CLAIM_ATTEMPTS: usize = 5;

/// How often the Leases seen are looked at for lapses.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Informers whose objects only need looking up: no subscriber.
pub(crate) struct NoSubscriber;

impl<K> Subscriber<K> for NoSubscriber {
    fn update(&mut self, _: &KeyObjects<K>) {}
}

type LeaseInformer = Informer<Lease, NoSubscriber>;
type RecordInformer = Informer<Secret, NoSubscriber>;

/// What a replica knows of its peers' Leases.
#[derive(Debug, Clone)]
struct Seen {
    /// The Lease's `renewTime` as last seen, compared as written.
    renewed: String,
    /// When this replica saw `renewed` change (its own clock).
    at: Instant,
}

#[derive(Default)]
struct State {
    /// Start of this replica's last successful renewal.
    renewed: Option<Instant>,
    /// Whether [`Replicas::may_act`] was true at the last look.
    acting: bool,
    /// Peers by replica id, as their Leases were last seen.
    seen: HashMap<String, Seen>,
    /// Replica ids that were lapsed or gone at the last look.
    lapsed: Vec<String>,
    /// When the core was last asked to look again for sessions nobody
    /// live owns.
    orphans_told: Option<Instant>,
    /// Whether the last look could tell a lapsed peer from a live one
    /// (this replica renews, its watch of the Leases works).
    view_is_current: bool,
}

/// Who gets a session's objects when a replica asks to hold them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This replica: it may adopt the session.
    Mine,
    /// A live peer, or a survivor that claimed it first.
    Theirs,
}

pub struct KubeReplicas {
    id: String,
    url: String,
    token: PeerToken,
    duration: Duration,
    managed_by: String,
    leases: Api<Lease>,
    lease_cache: Arc<LeaseInformer>,
    pods: Arc<PodInformer>,
    /// The watch records, when watch sessions are on.
    records: Option<Arc<RecordInformer>>,
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    /// Whether this replica is the installation's refiller: the live
    /// replica (this one included) with the lowest id. Every replica sees
    /// the same Leases, so they agree but for the moments a Lease comes
    /// or goes.
    refiller: watch::Sender<bool>,
    /// Set once the Leases have been looked at.
    looked: watch::Sender<bool>,
    /// Fired by [`KubeReplicas::release`]: the Lease is renewed no more.
    released: CancellationToken,
    /// Held through each renewal, so a release waits out the one in
    /// flight before it deletes the Lease.
    renewing: tokio::sync::Mutex<()>,
    /// The last list of Leases read from the apiserver itself, and when.
    listed: tokio::sync::Mutex<Option<(Instant, Vec<Peer>)>>,
}

/// How long a list of Leases read from the apiserver answers for.
const LISTED_FOR: Duration = Duration::from_millis(500);

impl KubeReplicas {
    /// Starts this replica's Lease and the caches it reads: Leases in
    /// `namespace` (the runner's own), watch records in the session
    /// namespace. The tasks are `tasks`' to stop.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        config: &ReplicationConfig,
        client: &Client,
        namespace: &str,
        session_namespace: &str,
        watch_records: bool,
        managed_by: &str,
        pods: Arc<PodInformer>,
        metrics: &Metrics,
        tasks: &OwnedTasks,
    ) -> Arc<Self> {
        let stop = tasks.stopping();
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let (lease_cache, lease_task) = LeaseInformer::start(
            leases.clone(),
            watcher::Config::default().labels(&format!(
                "{MANAGED_BY_LABEL}={managed_by},{ROLE_LABEL}={ROLE_REPLICA}"
            )),
            Kind {
                what: "leases",
                readyz_name: "the replica Lease watch",
                listing: "replica Leases",
                key: |lease: &Lease| lease.spec.as_ref()?.holder_identity.clone(),
                slim: |lease: &mut Lease| lease.metadata.managed_fields = None,
            },
            metrics.watch_restarts("leases"),
            stop.clone(),
        );
        let records = watch_records.then(|| {
            let (records, record_task) = RecordInformer::start(
                Api::namespaced(client.clone(), session_namespace),
                watcher::Config::default().labels(&format!(
                    "{MANAGED_BY_LABEL}={managed_by},{MODE_LABEL}={WATCH_MODE}"
                )),
                Kind {
                    what: "watch-records",
                    readyz_name: "the watch record watch",
                    listing: "watch session records",
                    key: |secret: &Secret| {
                        secret
                            .metadata
                            .labels
                            .as_ref()?
                            .get(SESSION_ID_LABEL)
                            .cloned()
                    },
                    // Ownership is all this cache answers: the files and
                    // records stay in the apiserver.
                    slim: |secret: &mut Secret| {
                        secret.data = None;
                        secret.string_data = None;
                        secret.metadata.managed_fields = None;
                    },
                },
                metrics.watch_restarts("watch-records"),
                stop.clone(),
            );
            tasks.adopt(record_task);
            records
        });
        tasks.adopt(lease_task);
        let replicas = Arc::new(Self {
            id: config.id.clone(),
            url: config.url.clone(),
            token: PeerToken::new(config.token.0.as_str()),
            duration: config.lease_duration,
            managed_by: managed_by.to_owned(),
            leases,
            lease_cache,
            pods,
            records,
            state: Mutex::new(State::default()),
            changes: watch::Sender::new(0),
            refiller: watch::Sender::new(false),
            looked: watch::Sender::new(false),
            released: CancellationToken::new(),
            renewing: tokio::sync::Mutex::new(()),
            listed: tokio::sync::Mutex::new(None),
        });
        info!(replica = %replicas.id, url = %replicas.url, lease_seconds = replicas.duration.as_secs(), "serving as one replica of several");
        tasks.adopt(tokio::spawn(lease::renew_until(
            replicas.clone(),
            stop.clone(),
        )));
        tasks.adopt(tokio::spawn(look_until(replicas.clone(), stop)));
        replicas
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Resolves once the Leases and the watch records have been listed
    /// and the Leases looked at: before that no peer can be told alive
    /// from lapsed, and every session would look like nobody's.
    pub async fn wait_synced(&self) {
        self.lease_cache.wait_synced().await;
        if let Some(records) = &self.records {
            records.wait_synced().await;
        }
        let mut looked = self.looked.subscribe();
        let _ = looked.wait_for(|looked| *looked).await;
    }

    /// Why this replica cannot serve yet (`/readyz`), if it cannot.
    pub fn not_ready_reason(&self) -> Option<String> {
        if let Some(reason) = self
            .lease_cache
            .not_ready_reason()
            .or_else(|| self.records.as_ref()?.not_ready_reason())
        {
            return Some(reason);
        }
        if !self.may_act() {
            return Some("this replica has not renewed its Lease".to_owned());
        }
        (!lock(&self.state).view_is_current)
            .then(|| "this replica has not looked at its peers' Leases yet".to_owned())
    }

    fn records_of(&self, session_id: &str) -> Vec<Arc<Secret>> {
        self.records
            .as_ref()
            .map(|records| records.objects_of(session_id))
            .unwrap_or_default()
    }

    fn all_records(&self) -> Vec<Arc<Secret>> {
        self.records
            .as_ref()
            .map(|records| records.objects())
            .unwrap_or_default()
    }

    /// The peers whose Leases are current: those seen renewing within the
    /// Lease, and those whose Lease appeared since the last look (a replica
    /// that just joined is reached at once, not a look later).
    fn live_peers(&self) -> Vec<Peer> {
        let state = lock(&self.state);
        let mut peers: Vec<Peer> = self
            .lease_cache
            .objects()
            .iter()
            .filter_map(|lease| peer_of(lease))
            .filter(|peer| {
                let alive = match state.seen.get(&peer.id) {
                    Some(seen) => seen.at.elapsed() < self.duration,
                    None => true,
                };
                peer.id != self.id && alive
            })
            .collect();
        peers.sort_by(|a, b| a.id.cmp(&b.id));
        peers
    }

    /// The live peers, with any replica whose Lease the apiserver has and
    /// the cache does not show yet (one that started a moment ago): one
    /// list at most every [`LISTED_FOR`], shared by every caller.
    async fn peers_listed(&self) -> Vec<Peer> {
        let mut listed = self.listed.lock().await;
        let fresh = match &*listed {
            Some((at, peers)) if at.elapsed() < LISTED_FOR => peers.clone(),
            _ => {
                let params = kube::api::ListParams::default().labels(&format!(
                    "{MANAGED_BY_LABEL}={},{ROLE_LABEL}={ROLE_REPLICA}",
                    self.managed_by
                ));
                let peers = match self.leases.list(&params).await {
                    Ok(list) => list.items.iter().filter_map(peer_of).collect(),
                    Err(err) => {
                        debug!(error = %err, "could not list the replica Leases");
                        Vec::new()
                    }
                };
                *listed = Some((Instant::now(), peers.clone()));
                peers
            }
        };
        drop(listed);
        let mut peers = self.live_peers();
        let state = lock(&self.state);
        for peer in fresh {
            // Only Leases this replica has never seen: one it saw lapse
            // stays lapsed.
            if peer.id != self.id
                && !state.seen.contains_key(&peer.id)
                && !peers.iter().any(|p| p.id == peer.id)
            {
                peers.push(peer);
            }
        }
        peers
    }

    /// Whether `replica` is a peer whose Lease is current.
    fn is_alive(&self, replica: &str) -> bool {
        let state = lock(&self.state);
        // Without a current view every peer might be alive.
        if !state.view_is_current {
            return true;
        }
        match state.seen.get(replica) {
            Some(seen) => seen.at.elapsed() < self.duration,
            // A Lease that appeared since the last look is a live one.
            None => self.lease_cache.objects().iter().any(|lease| {
                lease
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.holder_identity.as_deref())
                    == Some(replica)
            }),
        }
    }

    /// The replica a session's objects name, if any: its watch record's,
    /// else its pod's.
    fn recorded_owner(&self, session_id: &str) -> Option<String> {
        let from_record = self
            .records_of(session_id)
            .into_iter()
            .find_map(|secret| owner_in(secret.meta()));
        from_record.or_else(|| {
            self.pods
                .objects_of(session_id)
                .into_iter()
                .find_map(|pod| owner_in(pod.meta()))
        })
    }

    /// Follows whether this replica is the refiller (warm pools, leftover
    /// sweeps).
    pub fn refiller(&self) -> watch::Receiver<bool> {
        self.refiller.subscribe()
    }

    /// Whether a replica other than this one is named by the session's
    /// objects (alive or not: a lapsed peer's sessions are claimed, not
    /// swept).
    pub(crate) fn named_elsewhere(&self, session_id: &str) -> bool {
        self.recorded_owner(session_id)
            .is_some_and(|owner| owner != self.id)
    }

    /// Asks to hold the session whose object `meta` is (a run pod, a watch
    /// record): claimed with a write conditional on the object's
    /// resourceVersion when it names this replica or no live one, left
    /// alone when it names a live peer. A write refused
    /// because the object changed is tried again on what it is now, unless
    /// the change was another replica's claim.
    pub async fn claim<K>(&self, api: &Api<K>, meta: &kube::api::ObjectMeta) -> Claim
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match self.claim_object(api, meta).await {
            Some(_) => Claim::Mine,
            None => Claim::Theirs,
        }
    }

    /// [`KubeReplicas::claim`], giving back the object as claimed: newer
    /// than anything its previous owner wrote before letting go (a write
    /// conditional on an older version would have been refused).
    pub async fn claim_object<K>(&self, api: &Api<K>, meta: &kube::api::ObjectMeta) -> Option<K>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let name = meta.name.clone()?;
        let mut meta = meta.clone();
        for _ in 0..CLAIM_ATTEMPTS {
            let recorded = owner_in(&meta);
            // Even an object that names this replica is written (the same
            // name, conditional on its version): what this replica read
            // may be from before it was cut off, and a survivor may have
            // claimed the session since.
            if let Some(owner) = &recorded
                && *owner != self.id
                && self.is_alive(owner)
            {
                return None;
            }
            let mut precondition = serde_json::Map::new();
            if let Some(version) = &meta.resource_version {
                precondition.insert("resourceVersion".to_owned(), json!(version));
            }
            precondition.insert(
                "annotations".to_owned(),
                json!({ REPLICA_ANNOTATION: self.id }),
            );
            let patch = json!({ "metadata": precondition });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(claimed) => {
                    if recorded.as_deref() != Some(self.id.as_str()) {
                        info!(object = %name, from = recorded.as_deref().unwrap_or("(none)"), "took over a session");
                    }
                    return Some(claimed);
                }
                Err(err) if is_conflict(&err) => match api.get_opt(&name).await {
                    Ok(Some(now)) => {
                        let now = now.meta().clone();
                        if owner_in(&now) != recorded {
                            // Claimed by another survivor in between: it
                            // holds the session now, whatever this replica
                            // has seen of its Lease so far.
                            debug!(object = %name, "another replica claimed the session first");
                            return None;
                        }
                        meta = now;
                    }
                    _ => return None,
                },
                Err(err) if is_not_found(&err) => return None,
                Err(err) => {
                    warn!(object = %name, error = %err, "could not claim a session; trying again later");
                    return None;
                }
            }
        }
        None
    }

    /// On shutdown, once every session is left for the next owner: the
    /// Lease is deleted, so peers take the sessions over at once instead
    /// of when it would lapse.
    pub async fn release(&self) {
        self.released.cancel();
        let _renewal = self.renewing.lock().await;
        lock(&self.state).renewed = None;
        lease::delete_own(self).await;
    }

    fn look(&self) {
        let now = Instant::now();
        let mut state = lock(&self.state);
        let acting = self.may_act_at(&state, now);
        // What this replica sees of the Leases is only as fresh as its own
        // link to the apiserver: while it cannot renew its own Lease or its
        // watch of them is failing, a peer's silence says nothing. Every
        // peer then counts as just seen, so none can lapse until this
        // replica has watched them, connected, for a whole Lease.
        let view_is_current = acting && self.lease_cache.read_error().is_none();
        let mut seen = HashMap::new();
        for lease in self.lease_cache.objects() {
            let Some(spec) = &lease.spec else { continue };
            let Some(holder) = spec.holder_identity.clone() else {
                continue;
            };
            if holder == self.id {
                continue;
            }
            let renewed = spec
                .renew_time
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            let at = match state.seen.get(&holder) {
                Some(before) if before.renewed == renewed && view_is_current => before.at,
                _ => now,
            };
            seen.insert(holder, Seen { renewed, at });
        }
        let mut lapsed: Vec<String> = state
            .seen
            .keys()
            .filter(|id| view_is_current && !seen.contains_key(*id))
            .cloned()
            .chain(
                seen.iter()
                    .filter(|(_, s)| now.duration_since(s.at) >= self.duration)
                    .map(|(id, _)| id.clone()),
            )
            .collect();
        lapsed.sort();
        state.seen = seen;
        state.view_is_current = view_is_current;
        let newly_lapsed = lapsed.iter().any(|id| !state.lapsed.contains(id));
        let flipped = acting != state.acting;
        let lowest = state
            .seen
            .iter()
            .filter(|(_, seen)| now.duration_since(seen.at) < self.duration)
            .all(|(id, _)| *id > self.id);
        self.refiller.send_if_modified(|refiller| {
            let now_refiller = acting && lowest;
            let changed = *refiller != now_refiller;
            *refiller = now_refiller;
            changed
        });
        state.lapsed = lapsed;
        state.acting = acting;
        drop(state);
        if flipped && !acting {
            warn!(replica = %self.id, "this replica has not renewed its Lease in time: it stops acting on its sessions");
        }
        // Sessions nobody live owns are looked for again now and then (a
        // claim that failed is tried again), not at every look: a look
        // costs the core a list of the watch records.
        let orphans_due = acting
            && lock(&self.state)
                .orphans_told
                .is_none_or(|at| now.duration_since(at) >= self.duration / 3)
            && self.orphans() > 0;
        if flipped || newly_lapsed || orphans_due {
            lock(&self.state).orphans_told = Some(now);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Sessions whose objects name a replica that is neither this one nor
    /// alive, or name none.
    fn orphans(&self) -> usize {
        let orphaned = |meta: &kube::api::ObjectMeta| match owner_in(meta) {
            Some(owner) => owner != self.id && !self.is_alive(&owner),
            None => true,
        };
        let pods = self
            .pods
            .objects()
            .iter()
            .filter(|pod| {
                !crate::pod::labels::is_idle(pod) && !crate::pod::labels::is_watch_pod(pod)
            })
            .filter(|pod| orphaned(pod.meta()))
            .count();
        let records = self
            .all_records()
            .iter()
            .filter(|secret| orphaned(secret.meta()))
            .count();
        pods + records
    }

    fn may_act_at(&self, state: &State, now: Instant) -> bool {
        state
            .renewed
            .is_some_and(|at| self.may_act_at_renewal(at, now))
    }

    /// Whether, at `now`, a renewal started at `renewed` lets this replica
    /// act.
    fn may_act_at_renewal(&self, renewed: Instant, now: Instant) -> bool {
        now.saturating_duration_since(renewed) < self.acting_for()
    }

    /// How long after the start of its last successful renewal a replica
    /// may act: four fifths of the Lease, leaving a fifth for clock drift
    /// and for a write of its that is still on its way.
    fn acting_for(&self) -> Duration {
        self.duration - self.duration / 5
    }
}

/// The replica a Lease is held by and how it is reached.
fn peer_of(lease: &Lease) -> Option<Peer> {
    let id = lease.spec.as_ref()?.holder_identity.clone()?;
    let url = lease
        .metadata
        .annotations
        .as_ref()?
        .get(URL_ANNOTATION)?
        .clone();
    (!url.is_empty()).then_some(Peer { id, url })
}

/// The replica an object names.
pub(crate) fn owner_in(meta: &kube::api::ObjectMeta) -> Option<String> {
    meta.annotations.as_ref()?.get(REPLICA_ANNOTATION).cloned()
}

async fn look_until(replicas: Arc<KubeReplicas>, stop: CancellationToken) {
    replicas.lease_cache.wait_synced().await;
    if let Some(records) = &replicas.records {
        records.wait_synced().await;
    }
    loop {
        replicas.look();
        replicas.looked.send_replace(true);
        tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => {}
            () = stop.cancelled() => return,
        }
    }
}

impl Replicas for KubeReplicas {
    fn replica_id(&self) -> &str {
        &self.id
    }

    fn owner(&self, session_id: &str) -> Owner {
        let Some(owner) = self.recorded_owner(session_id) else {
            return Owner::Here;
        };
        if owner == self.id {
            return Owner::Recorded;
        }
        match self.live_peers().into_iter().find(|peer| peer.id == owner) {
            Some(peer) => Owner::Peer(peer),
            None => Owner::Moving { from: owner },
        }
    }

    fn peers(&self) -> Vec<Peer> {
        self.live_peers()
    }

    fn peers_now(&self) -> futures_util::future::BoxFuture<'_, Vec<Peer>> {
        Box::pin(self.peers_listed())
    }

    fn peer_token(&self) -> &PeerToken {
        &self.token
    }

    fn may_act(&self) -> bool {
        let state = lock(&self.state);
        self.may_act_at(&state, Instant::now())
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }

    /// From the shared caches: run and app pods that have not finished,
    /// and watch sessions whose pod exists, named by another replica.
    fn elsewhere(&self) -> Elsewhere {
        let elsewhere =
            |meta: &kube::api::ObjectMeta| owner_in(meta).is_some_and(|owner| owner != self.id);
        let runs = self
            .pods
            .objects()
            .iter()
            .filter(|pod| {
                !crate::pod::labels::is_idle(pod)
                    && !crate::pod::labels::is_watch_pod(pod)
                    && !crate::pod::status::is_finished(pod)
                    && elsewhere(pod.meta())
            })
            .count();
        let watches = self
            .all_records()
            .iter()
            .filter(|secret| elsewhere(secret.meta()))
            .filter_map(|secret| {
                secret
                    .metadata
                    .labels
                    .as_ref()?
                    .get(SESSION_ID_LABEL)
                    .cloned()
            })
            .filter(|id| {
                self.pods
                    .objects_of(id)
                    .iter()
                    .any(|pod| crate::pod::labels::is_watch_pod(pod))
            })
            .count();
        Elsewhere {
            sessions: runs + watches,
            watch_sessions: watches,
        }
    }
}
