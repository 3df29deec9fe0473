//! kube-sim: a simulated Kubernetes apiserver and kubelet for tests,
//! benchmarks and demos. The apiserver answers real clients (kube-rs,
//! kubectl) with real error bodies and watch semantics; the kubelet runs
//! containers as local processes, or as real containers of a docker engine
//! (`Runtime::Docker`). See the README for what is simulated.

#![forbid(unsafe_code)]

pub mod apiserver;
pub mod controllers;
pub mod errors;
pub mod events;
pub mod faults;
pub mod kinds;
pub mod kubeconfig;
pub mod kubelet;
pub mod meta;
pub mod sim;
pub mod stats;
pub mod storage;
pub mod timeline;

pub use apiserver::authz::Denial;
pub use errors::ApiError;
pub use faults::{FaultCommand, Faults};
pub use kubelet::Latency;
pub use kubelet::engine::Runtime;
pub use kubelet::images::{ImageBehaviour, ImageTable};
pub use kubelet::podnet::PodNetwork;
pub use sim::{KubeSim, KubeSimBuilder, SeedError, StartError, WaitError, find_fake_telo};
pub use stats::Stats;
pub use timeline::PodTimeline;
