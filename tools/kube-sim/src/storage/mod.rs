//! The apiserver's storage layer: the versioned object store with its
//! transactions, the registry that validates, defaults and admits every
//! write (quota included), label and field selectors, and patches. The HTTP
//! layer (`apiserver`), the controllers and the kubelet all use it; it uses
//! none of them.

pub mod decode;
pub mod defaults;
pub mod patch;
pub mod quantity;
pub mod quota;
pub mod registry;
pub mod selectors;
pub mod store;
pub mod validation;
