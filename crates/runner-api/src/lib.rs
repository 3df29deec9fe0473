//! The `/v1` runner contract as data, shared by the runner and its clients:
//!
//! * [`types`] — the JSON the editor sends and reads;
//! * [`validate`] — request-body validation with the reference's exact
//!   messages and coercions, and the JSON Schemas generated from the same
//!   definitions ([`validate::request_schemas`]);
//! * [`js`] — the JavaScript semantics the reference's parsing has
//!   (`Number()`, `trim`, own-key order);
//! * [`bundle_path`] — the bundle path rules;
//! * [`app_env`] — which client variables an app session takes;
//! * [`watch`] — watch sessions: apps, the workspace surface;
//! * [`telo`] — the telo version a request names per app;
//! * [`sse`] and [`io`] — the event-stream and terminal frame codecs, with
//!   the one SSE parser every reader uses.
//!
//! No HTTP framework, no runtime, no I/O: a client can depend on it without
//! pulling in the server.

pub mod app_env;
pub mod bundle_path;
pub mod io;
pub mod js;
pub mod ports;
pub mod sse;
pub mod telo;
pub mod types;
pub mod validate;
pub mod watch;
