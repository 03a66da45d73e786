//! The command that `exec` and `lock` run under a lease: the child process
//! and its signals (`child`), and when it must be stopped (`deadline`).
//! Shared by both, so neither reaches into the other.

pub(crate) mod child;
pub(crate) mod deadline;
