//! Talking to the cluster: the client, what its failures mean, and the
//! informer (a list-watch kept in a local store) every cache of cluster
//! objects is built on.

pub(crate) mod api_error;
pub(crate) mod client;
pub mod informer;
mod informer_loop;
