//! The command that `exec` and `lock` run under a lease: the child process
//! and its signals (`child`), when it must be stopped (`deadline`), and the
//! loop's phases and steps while it runs (`watch`). Shared by both, so
//! neither reaches into the other.

pub(crate) mod child;
pub(crate) mod deadline;
pub(crate) mod watch;
