//! Publishing the worker ID to the app beside the sidecar: the files on the shared volume and
//! the HTTP routes, both only reading the keeper's state.
//!
//! - [`files`]: the sidecar's side of the published files (the held record, the output lock,
//!   the earlier record); their format is [`crate::published`].
//! - [`writer`]: keeps the ID file and the state file in step with the state.
//! - [`routes`]: `/id`, `/readyz`, `/metrics`.

pub(crate) mod files;
pub(crate) mod routes;
pub(crate) mod writer;
