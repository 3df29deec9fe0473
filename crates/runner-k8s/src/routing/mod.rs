//! Per-session routing: Service plus Ingress or Gateway API HTTPRoutes.

pub mod mode;
